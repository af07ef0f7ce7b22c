//! `sous pull REPO[@REVISION]` and `sous pull --recipe FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sous_engine::recipe::DEFAULT_REVISION;
use sous_engine::repo::RepoId;
use sous_engine::size::human;

use super::{OverrideArgs, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;
use sous::hub::api::HubClient;
use sous::hub::config::HubConfig;
use sous::hub::pull::{DEFAULT_CONNECTIONS, PullRequest, pull};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous pull HuggingFaceTB/SmolLM2-135M-Instruct\n  sous pull Qwen/Qwen3.8-27B@main --include '*.safetensors' --json\n  sous pull --recipe recipes/local/smollm2-135m.toml"
)]
pub struct PullArgs {
    /// Repository id, optionally with a revision: `org/name` or `org/name@v1.0`.
    #[arg(
        value_name = "REPO[@REVISION]",
        required_unless_present = "recipe",
        conflicts_with = "recipe"
    )]
    repo: Option<String>,
    /// Pull the model a recipe names (`model.repo` at `model.revision`).
    #[arg(long, short = 'r', value_name = "FILE")]
    recipe: Option<PathBuf>,
    /// Only paths matching these globs (repeatable). Default: what serving needs.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Skip paths matching these globs (repeatable).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Write plain files into this directory instead of the Hub cache.
    #[arg(long, value_name = "DIR")]
    local_dir: Option<PathBuf>,
    /// Use only what is already on disk (as HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
    /// Connections at once, over all files.
    #[arg(long, default_value_t = DEFAULT_CONNECTIONS, value_name = "N")]
    connections: usize,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// No progress on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

pub fn exec(args: PullArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let (repo, revision, local_dir) = match (&args.repo, &args.recipe) {
        (Some(spec), _) => {
            let (repo, revision) = spec.split_once('@').unwrap_or((spec, DEFAULT_REVISION));
            (
                repo.parse::<RepoId>()?,
                revision.to_owned(),
                args.local_dir.clone(),
            )
        }
        (None, Some(file)) => {
            let loaded = load_recipe(file, &args.overrides)?;
            let model = loaded.recipe.model;
            let repo = model.repo.ok_or_else(|| {
                UserError::new(
                    format!("recipe {} names no `model.repo` to pull", display(file)),
                    Some("set `model.repo`; with `model.path` too, the files go to that directory"),
                )
            })?;
            // With both, the recipe says where the weights must end up.
            let local = args.local_dir.clone().or(model.path.map(PathBuf::from));
            let revision = model.revision.unwrap_or_else(|| DEFAULT_REVISION.to_owned());
            (repo, revision, local)
        }
        (None, None) => {
            return Err(UserError::new("nothing to pull", Some("give `org/name` or `--recipe FILE`")).into());
        }
    };
    let config = HubConfig::from_env();
    let request = PullRequest {
        repo,
        revision,
        include: args.include,
        exclude: args.exclude,
        local_dir,
        offline: args.offline || config.offline,
        connections: args.connections,
    };
    let reporter = if args.quiet { shell.quiet() } else { shell.clone() };
    let runtime = super::runtime()?;
    let client = HubClient::new(config)?;
    let report = runtime.block_on(pull(&client, &request, &reporter))?;
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&report.path.display().to_string())?;
    }
    if report.up_to_date {
        shell.status(
            "up to date",
            &format!(
                "{}@{} ({} files, {})",
                report.repo,
                &report.commit[..12],
                report.files,
                human(report.bytes)
            ),
        );
    } else {
        let resumed = if report.resumed_bytes > 0 {
            format!(", {} resumed", human(report.resumed_bytes))
        } else {
            String::new()
        };
        // What verified the large files: the Xet hash the Hub gave, sha256 where it gave
        // none (small files' git sha1 is not worth a mention).
        let mut with = Vec::new();
        if report.verified_with.contains_key("xet") {
            with.push("the Xet hash".to_owned());
        }
        if report.verified_with.contains_key("sha256") || with.is_empty() {
            with.push(format!("sha256 ({})", report.sha256));
        }
        let direct = match report.direct_files {
            0 => String::new(),
            1 => "; 1 file written past the page cache".to_owned(),
            n => format!("; {n} files written past the page cache"),
        };
        shell.status(
            "pulled",
            &format!(
                "{}@{}: {} files, {} downloaded in {:.1} s ({:.0} MB/s; download {:.0} MB/s, verification {:.0} MB/s with {}, bound by {}{direct}){resumed}",
                report.repo,
                &report.commit[..12],
                report.files,
                human(report.downloaded_bytes),
                report.seconds,
                report.mb_per_s,
                report.download_mb_per_s,
                report.verify_mb_per_s,
                with.join(" and "),
                match report.bound {
                    // Say why: the writes, not the network, held the ranges.
                    "disk" => format!(
                        "the disk: writes took {:.0} % of the download's time",
                        report.write_share * 100.0
                    ),
                    other => other.to_owned(),
                },
            ),
        );
    }
    Ok(ExitCode::SUCCESS)
}
