//! `sous deploy`: the same recipe run by something other than `sous serve` on this
//! machine: Kubernetes (a Deployment, or a LeaderWorkerSet across nodes), compose, or
//! systemd. The output is files, byte for byte the same for the same recipe, for
//! review in a pull request and for GitOps tools to apply as they are.
//!
//! - `pod`: what runs, decided once for every target ([`Plan`]).
//! - `k8s`: typed Kubernetes objects (`k8s-openapi`), never string templates.
//! - `router`: the router in front of the replicas, decided once for every target.
//! - `compose`, `systemd`: the same plan for one machine.
//! - `yaml`: YAML that YAML 1.1 readers (Kubernetes, Compose v1) read back exactly.
//! - `out`: writing a rendering into a directory sous owns, and diffing one.
//!
//! sous never manages a cluster: it renders, and `kubectl`, Flux or Argo CD apply.

mod compose;
mod error;
mod k8s;
pub mod out;
pub mod pod;
pub mod router;
mod size;
mod systemd;
mod yaml;

pub use error::DeployError;
pub use pod::Plan;
pub use size::model_bytes;

use sous_engine::recipe::Recipe;

/// What `sous deploy render` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Kubernetes manifests and a `kustomization.yaml`.
    K8s,
    /// A `docker-compose.yml`.
    Compose,
    /// systemd units running `sous serve`.
    Systemd,
}

impl Target {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Target::K8s => "k8s",
            Target::Compose => "compose",
            Target::Systemd => "systemd",
        }
    }
}

/// What a rendering needs beside the recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The model's size on disk, when known (sizes the volume sous creates; without it
    /// `deploy.storage.size` must be set).
    pub model_bytes: Option<u64>,
    /// Where the `sous` binary is on the machine a systemd unit runs on.
    pub sous_bin: String,
    /// Where the router's program is on that machine; default: its name, which
    /// systemd finds on its search path (`/usr/local/bin` first).
    pub router_bin: Option<String>,
    /// The starts `sous serve` recorded for the recipe on this machine, which size the
    /// Kubernetes start-up probe.
    pub starts: Vec<sous_engine::serve::starts::Start>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            model_bytes: None,
            sous_bin: pod::SOUS_IN_IMAGE.to_owned(),
            router_bin: None,
            starts: Vec::new(),
        }
    }
}

/// One rendered file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Its name in the output directory.
    pub name: String,
    /// Its contents.
    pub contents: String,
}

/// A rendering: files in the order they are printed, and what the author should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendering {
    /// The target.
    pub target: Target,
    /// The files, as `--out` writes them.
    pub files: Vec<File>,
    /// What the field reports learned the hard way, where it applies to this recipe.
    pub warnings: Vec<String>,
}

impl Rendering {
    /// Everything as one text for stdout: for Kubernetes one YAML stream of every object
    /// (`kubectl apply -f -` reads it; the kustomization is left out); otherwise the one
    /// file, or each file under a `# ==> NAME <==` line.
    pub fn stream(&self) -> String {
        match self.target {
            Target::K8s => self
                .files
                .iter()
                .filter(|f| f.name != k8s::KUSTOMIZATION)
                .map(|f| f.contents.as_str())
                .collect::<Vec<_>>()
                .join("---\n"),
            _ if self.files.len() == 1 => self.files[0].contents.clone(),
            _ => self
                .files
                .iter()
                .map(|f| format!("# ==> {} <==\n{}", f.name, f.contents))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// Renders `recipe` for `target`.
pub fn render(recipe: &Recipe, target: Target, options: &Options) -> Result<Rendering, DeployError> {
    let mut warnings = Vec::new();
    let files = match target {
        Target::K8s => {
            let plan = Plan::new(recipe, false)?.with_starts(&options.starts);
            warnings.extend(plan.warnings.iter().cloned());
            k8s::render(&plan, options, &mut warnings)?
        }
        Target::Compose => {
            let plan = Plan::new(recipe, true)?;
            warnings.extend(plan.warnings.iter().cloned());
            compose::render(&plan, &mut warnings)?
        }
        // systemd runs `sous serve` itself, which pulls and quantizes as on any host.
        Target::Systemd => systemd::render(recipe, options)?,
    };
    Ok(Rendering {
        target,
        files,
        warnings,
    })
}
