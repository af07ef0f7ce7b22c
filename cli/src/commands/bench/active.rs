//! The active workloads of `sous bench` (`probe`, `sweep`, `prefix`, `agent`): against
//! `--url`, or against the server of `--recipe`, started before and stopped after
//! whatever happens; then the report on stdout and, with `--out`, on disk.
//!
//! Not here: the flags and the workloads they make ([`super`]), or the run itself
//! (`sous::bench::run`).

use std::path::Path;
use std::process::ExitCode;

use sous::bench::report;
use sous::bench::run::{self, Target};
use sous::bench::stats::Slo;
use sous::bench::workload::Workload;
use sous_engine::serve::Instance;

use super::Common;
use crate::failure::UserError;
use crate::shell::Shell;

/// Serves `recipe` for the length of a benchmark; returns the instance, its base URL and
/// the API key its recipe names.
async fn serve(
    file: &Path,
    overrides: &crate::commands::OverrideArgs,
    shell: &Shell,
) -> anyhow::Result<(Instance, String, Option<String>)> {
    let recipe = crate::commands::load_recipe(file, overrides)?.recipe;
    let key = crate::commands::recipe_api_key(&recipe);
    let (instance, url) =
        sous::pipeline::session::for_session(&recipe, std::sync::Arc::new(shell.clone())).await?;
    Ok((instance, url, key))
}

pub(super) fn active(common: &Common, workload: &Workload, shell: &Shell) -> anyhow::Result<ExitCode> {
    let slo = match &common.slo {
        Some(text) => Slo::parse(text)
            .map_err(|e| UserError::new(format!("--slo: {e}"), Some("e.g. --slo ttft:500,tpot:50")))?,
        None => Slo::default(),
    };
    if let Some(bad) = common.percentiles.iter().find(|p| !(0.0..=100.0).contains(*p)) {
        return Err(UserError::new(format!("--percentiles: {bad} is not between 0 and 100"), None).into());
    }
    let options = run::Options {
        seed: common.seed,
        salt: common.salt,
        percentiles: common.percentiles.clone(),
        slo,
        label: common.label.clone(),
    };
    let runtime = crate::commands::runtime()?;
    runtime.block_on(async {
        let (served, url, recipe_key) = match (&common.recipe, &common.url) {
            (Some(recipe), _) => {
                let (instance, url, key) = serve(recipe, &common.overrides, shell).await?;
                (Some(instance), url, key)
            }
            (None, Some(url)) => (None, url.trim_end_matches('/').to_owned(), None),
            (None, None) => return Err(UserError::new("pass --url URL or --recipe FILE", None).into()),
        };
        let measured = measure(common, workload, &options, url, recipe_key, shell).await;
        // The recipe's server stops whether the benchmark succeeded or not.
        if let Some(instance) = served {
            instance.stop().await?;
        }
        measured
    })
}

/// Runs the workload against `url` and reports it.
async fn measure(
    common: &Common,
    workload: &Workload,
    options: &run::Options,
    url: String,
    recipe_key: Option<String>,
    shell: &Shell,
) -> anyhow::Result<ExitCode> {
    let key = match crate::commands::api_key(common.api_key_env.as_deref())? {
        Some(key) => Some(key),
        None => recipe_key,
    };
    let target = Target {
        url,
        model: common.model.clone(),
        api_key: key,
        endpoint: common.endpoint.into(),
        tokenizer: common.tokenizer.clone(),
        instances: common
            .instances
            .iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect(),
    };
    let report = run::run(&target, workload, options, shell).await?;
    let text = report.to_json()?;
    if let Some(dir) = &common.out {
        let written = report::write(dir, &report, &common.percentiles)?;
        let charts: Vec<String> = written.charts.iter().map(|p| p.display().to_string()).collect();
        shell.status(
            "wrote",
            &format!(
                "{}, {} and {}",
                written.json.display(),
                written.csv.display(),
                charts.join(", ")
            ),
        );
    }
    if common.json {
        shell.data(&text)?;
    } else {
        shell.data(&report::summary(&report))?;
    }
    Ok(if report.failed() > 0 {
        ExitCode::from(sous::error::Class::User.exit_code())
    } else {
        ExitCode::SUCCESS
    })
}
