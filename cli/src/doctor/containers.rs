//! Container runtimes for recipes with `engine.runtime = "docker"` or `"podman"`: the
//! CLI on `PATH`, its version, and whether its containers can have the GPUs, which is
//! what `sous serve` asks of them (`--gpus all` with Docker, `--device
//! nvidia.com/gpu=all` with Podman). Nothing is pulled and no container is run.
//!
//! Docker gives containers GPUs through the NVIDIA Container Toolkit: a runtime named
//! `nvidia` in the daemon's configuration (`nvidia-ctk runtime configure`), or the
//! `nvidia-container-runtime-hook` the daemon finds on its `PATH` for `--gpus`
//! (moby `daemon/nvidia_linux.go`), or CDI devices `nvidia.com/gpu=...` it discovered
//! (`DiscoveredDevices`, Docker 28.2 and later). `docker info --format '{{json .}}'`
//! prints the daemon's `Info` (moby `api/types/system/info.go`: `Runtimes`, a map
//! from name to `{"path": ...}`; `ServerVersion`; `DiscoveredDevices`).
//!
//! Podman reads CDI specifications from the CDI library's default directories,
//! `/etc/cdi` and `/var/run/cdi` (`DefaultStaticDir` and `DefaultDynamicDir` of
//! container-device-interface `pkg/cdi`; containers.conf `cdi_spec_dirs` overrides
//! them); `nvidia-ctk cdi generate` writes one whose `kind` is `nvidia.com/gpu`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::exec::{self, SearchPath};

/// How long a container CLI may take.
const LIMIT: Duration = Duration::from_secs(10);

/// Where Podman looks for CDI specifications by default.
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The container runtimes.
#[derive(Debug, Clone, Serialize)]
pub struct Containers {
    /// Docker.
    pub docker: ContainerRuntime,
    /// Podman.
    pub podman: ContainerRuntime,
}

/// One container runtime.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ContainerRuntime {
    /// The CLI is on `PATH` and (Docker) its daemon answers.
    pub available: bool,
    /// The CLI.
    pub path: Option<String>,
    /// The daemon's version (Docker), else the CLI's.
    pub version: Option<String>,
    /// Whether its containers can have the NVIDIA GPUs.
    pub gpu: bool,
    /// How: `nvidia runtime`, `nvidia-container-runtime-hook`, or a CDI spec.
    pub gpu_via: Option<String>,
    /// What is missing.
    pub problem: Option<String>,
}

/// Both runtimes, probed concurrently.
pub async fn probe(search: &SearchPath) -> Containers {
    let cdi: Vec<PathBuf> = CDI_SPEC_DIRS.iter().map(PathBuf::from).collect();
    let (docker, podman) = tokio::join!(docker(search), podman(search, &cdi));
    Containers { docker, podman }
}

async fn docker(search: &SearchPath) -> ContainerRuntime {
    let Some(program) = search.which("docker") else {
        return ContainerRuntime {
            problem: Some("`docker` not on PATH".into()),
            ..ContainerRuntime::default()
        };
    };
    let path = Some(program.display().to_string());
    let (client, info) = tokio::join!(
        exec::run(&program, &["--version"], LIMIT),
        exec::run(&program, &["info", "--format", "{{json .}}"], LIMIT)
    );
    let client_version = client
        .ok()
        .filter(exec::Output::success)
        .and_then(|out| cli_version(&out.stdout));
    let unreachable = |why: String| ContainerRuntime {
        path: path.clone(),
        version: client_version.clone(),
        problem: Some(format!("the Docker daemon does not answer: {why}")),
        ..ContainerRuntime::default()
    };
    let out = match info {
        Ok(out) if out.success() => out,
        Ok(out) => return unreachable(out.last_words()),
        Err(e) => return unreachable(e.to_string()),
    };
    let Ok(info) = serde_json::from_str::<Value>(out.stdout.trim()) else {
        return unreachable("`docker info` printed no JSON".into());
    };
    if let Some(error) = info["ServerErrors"].as_array().and_then(|e| e.first()) {
        return unreachable(error.as_str().unwrap_or_default().to_owned());
    }
    let hook = search.which("nvidia-container-runtime-hook").is_some();
    let gpu_via = docker_gpu(&info, hook);
    ContainerRuntime {
        available: true,
        path,
        version: info["ServerVersion"]
            .as_str()
            .map(str::to_owned)
            .or(client_version),
        gpu: gpu_via.is_some(),
        problem: gpu_via.is_none().then(|| {
            "no GPU support: no `nvidia` runtime, no nvidia-container-runtime-hook on PATH, no CDI device nvidia.com/gpu".into()
        }),
        gpu_via,
    }
}

/// How Docker's containers get GPUs, from `docker info`'s JSON and whether
/// `nvidia-container-runtime-hook` is on `PATH`.
pub fn docker_gpu(info: &Value, hook_on_path: bool) -> Option<String> {
    if info["Runtimes"]
        .as_object()
        .is_some_and(|r| r.contains_key("nvidia"))
    {
        return Some("nvidia runtime".into());
    }
    let cdi = info["DiscoveredDevices"].as_array().and_then(|devices| {
        devices
            .iter()
            .filter_map(|d| d["ID"].as_str())
            .find(|id| id.starts_with("nvidia.com/gpu"))
    });
    if let Some(id) = cdi {
        return Some(format!("CDI device {id}"));
    }
    hook_on_path.then(|| "nvidia-container-runtime-hook".into())
}

async fn podman(search: &SearchPath, cdi_dirs: &[PathBuf]) -> ContainerRuntime {
    let Some(program) = search.which("podman") else {
        return ContainerRuntime {
            problem: Some("`podman` not on PATH".into()),
            ..ContainerRuntime::default()
        };
    };
    let path = Some(program.display().to_string());
    let version = match exec::run(&program, &["--version"], LIMIT).await {
        Ok(out) if out.success() => cli_version(&out.stdout),
        Ok(out) => {
            return ContainerRuntime {
                path,
                problem: Some(format!("`podman --version` failed ({})", out.failure())),
                ..ContainerRuntime::default()
            };
        }
        Err(e) => {
            return ContainerRuntime {
                path,
                problem: Some(e.to_string()),
                ..ContainerRuntime::default()
            };
        }
    };
    let spec = nvidia_cdi_spec(cdi_dirs);
    ContainerRuntime {
        available: true,
        path,
        version,
        gpu: spec.is_some(),
        problem: spec.is_none().then(|| {
            format!(
                "no GPU support: no CDI spec for nvidia.com/gpu in {} (`nvidia-ctk cdi generate` writes one)",
                cdi_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        }),
        gpu_via: spec.map(|s| format!("CDI spec {}", s.display())),
    }
}

/// The first CDI specification in `dirs` that declares `nvidia.com/gpu` devices.
pub fn nvidia_cdi_spec(dirs: &[PathBuf]) -> Option<PathBuf> {
    let mut specs: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    specs.sort();
    specs.into_iter().find(|path| declares_nvidia_gpus(path))
}

fn declares_nvidia_gpus(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.contains("nvidia.com/gpu"))
}

/// `Docker version 28.5.1, build e180ab8` → `28.5.1`; `podman version 5.4.0` →
/// `5.4.0`.
pub fn cli_version(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let after = &line[line.find("version")? + "version".len()..];
    let word = after.split_whitespace().next()?.trim_end_matches(',');
    (!word.is_empty()).then(|| word.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docker info --format '{{json .}}'` of Docker 28 with the NVIDIA Container Toolkit
    /// configured (the keys that matter, as the daemon prints them).
    const WITH_NVIDIA: &str = r#"{"ID":"b2c1","Containers":0,"ServerVersion":"28.5.1","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}},"DefaultRuntime":"runc","CDISpecDirs":["/etc/cdi","/var/run/cdi"]}"#;
    /// The same daemon without it.
    const PLAIN: &str = r#"{"ServerVersion":"28.5.1","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}},"DefaultRuntime":"runc","CDISpecDirs":["/etc/cdi","/var/run/cdi"]}"#;
    /// A daemon that discovered the toolkit's CDI devices.
    const CDI: &str = r#"{"ServerVersion":"28.5.1","Runtimes":{"runc":{"path":"runc"}},"DiscoveredDevices":[{"Source":"cdi","ID":"nvidia.com/gpu=0"},{"Source":"cdi","ID":"nvidia.com/gpu=all"}]}"#;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).expect("JSON")
    }

    #[test]
    fn docker_has_gpus_through_the_nvidia_runtime_cdi_or_the_hook() {
        assert_eq!(
            docker_gpu(&json(WITH_NVIDIA), false).as_deref(),
            Some("nvidia runtime")
        );
        assert_eq!(docker_gpu(&json(PLAIN), false), None);
        assert_eq!(
            docker_gpu(&json(PLAIN), true).as_deref(),
            Some("nvidia-container-runtime-hook")
        );
        assert_eq!(
            docker_gpu(&json(CDI), false).as_deref(),
            Some("CDI device nvidia.com/gpu=0")
        );
        assert_eq!(docker_gpu(&json("{}"), false), None);
    }

    #[test]
    fn reads_cli_versions() {
        assert_eq!(
            cli_version("Docker version 28.5.1, build e180ab8\n").as_deref(),
            Some("28.5.1")
        );
        assert_eq!(cli_version("podman version 5.4.0\n").as_deref(), Some("5.4.0"));
        assert_eq!(cli_version("something else"), None);
    }

    #[test]
    fn finds_an_nvidia_cdi_spec() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dirs = vec![dir.path().to_path_buf(), dir.path().join("absent")];
        assert_eq!(nvidia_cdi_spec(&dirs), None);
        std::fs::write(
            dir.path().join("amd.yaml"),
            "cdiVersion: 0.5.0\nkind: amd.com/gpu\n",
        )
        .expect("write");
        assert_eq!(nvidia_cdi_spec(&dirs), None);
        // As `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` writes it.
        let spec = dir.path().join("nvidia.yaml");
        std::fs::write(
            &spec,
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n",
        )
        .expect("write");
        assert_eq!(nvidia_cdi_spec(&dirs), Some(spec));
    }
}
