//! What the engines' official container images run by themselves: their `ENTRYPOINT`
//! and `CMD`, one entry per adapter (each cites its upstream Dockerfile there).
//!
//! A container runtime runs `ENTRYPOINT + CMD`, and the two targets override them
//! differently: Kubernetes' `command` replaces the `ENTRYPOINT` (and drops the `CMD`),
//! while compose's `command` replaces only the `CMD` and leaves the `ENTRYPOINT` in
//! front of it. So every target sous renders sets both: the entrypoint is the engine's
//! program and the command its arguments, and the container runs exactly the command
//! line `sous serve --dry-run` prints, whatever the image's own `ENTRYPOINT` is (the
//! official vLLM image's is `vllm serve`; the sous image's is `sous`). The table here is
//! what the tests compute each target's effective command line from.

use crate::recipe::EngineKind;
use crate::version::Version;

/// An image's `ENTRYPOINT` and `CMD`, as its Dockerfile sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDefaults {
    /// The repository, without registry host prefix `docker.io/` or tag.
    pub repository: &'static str,
    /// `ENTRYPOINT`, exec form.
    pub entrypoint: &'static [&'static str],
    /// `CMD`, exec form.
    pub cmd: &'static [&'static str],
}

/// The defaults of the image `reference` (`repo[:tag]`, as a recipe writes it), if it is
/// one of the official images sous renders for. `engine` and `version` (the recipe's
/// release) pick the entry where an image's entrypoint changed between releases; a
/// `vX.Y.Z` tag wins over `version`.
pub fn official(reference: &str, engine: EngineKind, version: Option<&Version>) -> Option<ImageDefaults> {
    let (repository, tag) = split(reference);
    let tagged: Option<Version> = tag
        .and_then(|t| t.strip_prefix('v').or(Some(t)))
        .and_then(|t| t.parse().ok());
    let version = tagged.as_ref().or(version);
    super::official_images(engine, version)
        .into_iter()
        .find(|d| d.repository == repository)
}

/// The image the repository's `Dockerfile` builds: `ENTRYPOINT ["/usr/local/bin/sous"]`
/// and `CMD ["--help"]`. The init containers of `sous deploy` run in it, and the native
/// engine does.
pub const SOUS_IMAGE: ImageDefaults = ImageDefaults {
    repository: "sous",
    entrypoint: &["/usr/local/bin/sous"],
    cmd: &["--help"],
};

/// `docker.io/vllm/vllm-openai:v0.27.1` → (`vllm/vllm-openai`, `v0.27.1`); a digest
/// (`@sha256:...`) is dropped.
fn split(reference: &str) -> (&str, Option<&str>) {
    let reference = reference.split('@').next().unwrap_or(reference);
    let reference = reference
        .strip_prefix("docker.io/library/")
        .or_else(|| reference.strip_prefix("docker.io/"))
        .unwrap_or(reference);
    // A `:` after the last `/` is a tag; before it, a registry port.
    match reference.rfind(':') {
        Some(i) if !reference[i..].contains('/') => (&reference[..i], Some(&reference[i + 1..])),
        _ => (reference, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        assert_eq!(
            split("vllm/vllm-openai:v0.27.1"),
            ("vllm/vllm-openai", Some("v0.27.1"))
        );
        assert_eq!(split("docker.io/vllm/vllm-openai"), ("vllm/vllm-openai", None));
        assert_eq!(
            split("nvcr.io/nvidia/tensorrt-llm/release:1.3.0@sha256:ab"),
            ("nvcr.io/nvidia/tensorrt-llm/release", Some("1.3.0"))
        );
        assert_eq!(split("localhost:5000/sous"), ("localhost:5000/sous", None));
    }

    #[test]
    fn the_vllm_image_changed_its_entrypoint_in_0_11_1() {
        let at = |image: &str, version: Option<Version>| {
            official(image, EngineKind::Vllm, version.as_ref()).map(|d| d.entrypoint)
        };
        assert_eq!(
            at("vllm/vllm-openai:v0.10.2", None),
            Some(&["python3", "-m", "vllm.entrypoints.openai.api_server"][..])
        );
        assert_eq!(at("vllm/vllm-openai:v0.27.1", None), Some(&["vllm", "serve"][..]));
        assert_eq!(
            at("vllm/vllm-openai:latest", Some(Version::new(0, 11, 0))),
            Some(&["python3", "-m", "vllm.entrypoints.openai.api_server"][..])
        );
        assert_eq!(at("vllm/vllm-openai", None), Some(&["vllm", "serve"][..]));
        assert_eq!(at("example.com/my-vllm:v0.27.1", None), None);
    }
}
