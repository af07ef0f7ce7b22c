//! `sous doctor [--json] [--recipes DIR] [--recipe FILE]...`: what this machine can
//! run. GPUs and driver, engines, container runtimes, the Hub, free space, and which
//! recipes can be served here and why not; exits 1 naming the first blocking problem
//! (a `--recipe` that cannot run, no recipe that can, a full cache). The probing is
//! [`sous::doctor`]; this file loads the recipes and draws the report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use sous::doctor::containers::ContainerRuntime;
use sous::doctor::engines::Installed;
use sous::doctor::recipes::{self, RecipeCheck};
use sous::doctor::{Report, Setup};
use sous_engine::size::gib;

use super::{OverrideArgs, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

/// The directory of shipped recipes, checked when no other is named.
const DEFAULT_RECIPES: &str = "recipes";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON object (keys: gpus, driver, engines, containers,
    /// hub, disk, recipes, blocking).
    #[arg(long)]
    json: bool,
    /// Check every recipe under this directory. Default: `recipes` when it exists in
    /// the current directory and no --recipe is given.
    #[arg(long, value_name = "DIR")]
    recipes: Option<PathBuf>,
    /// Check this recipe; doctor fails if it cannot run here (repeatable).
    #[arg(long = "recipe", short = 'r', value_name = "FILE")]
    recipe: Vec<PathBuf>,
}

pub fn exec(args: DoctorArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let files = recipe_files(&args)?;
    let setup = Setup::from_env();
    let machine = super::runtime()?.block_on(sous::doctor::examine(&setup));
    let cx = recipes::Context {
        machine: &machine,
        search: &setup.search,
        hub: &setup.hub,
    };
    let checks: Vec<RecipeCheck> = files
        .iter()
        .map(
            |(path, explicit)| match load_recipe(path, &OverrideArgs { set: Vec::new() }) {
                Ok(loaded) => recipes::check(path, &loaded.recipe, &cx, *explicit),
                Err(err) => {
                    let message = crate::failure::message(&err);
                    let prefix = format!("recipe {}: ", display(path));
                    let message = message.strip_prefix(&prefix).unwrap_or(&message).to_owned();
                    recipes::unloadable(path, message, *explicit)
                }
            },
        )
        .collect();
    let blocking = sous::doctor::blocking(&machine, &checks);
    let report = Report {
        machine,
        recipes: checks,
        blocking,
    };
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report).context("writing the report as JSON")?)?;
    } else {
        shell.data(&render(&report))?;
    }
    match report.blocking {
        Some(b) => Err(UserError::new(b.message, b.hint.as_deref()).into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The recipes to check, each with whether `--recipe` named it.
fn recipe_files(args: &DoctorArgs) -> anyhow::Result<Vec<(PathBuf, bool)>> {
    let mut files: Vec<(PathBuf, bool)> = args.recipe.iter().map(|p| (p.clone(), true)).collect();
    let dir = match &args.recipes {
        Some(dir) if !dir.is_dir() => {
            return Err(UserError::new(
                format!("--recipes {}: not a directory", display(dir)),
                Some("name the directory that holds the recipe files"),
            )
            .into());
        }
        Some(dir) => Some(dir.clone()),
        None if args.recipe.is_empty() && Path::new(DEFAULT_RECIPES).is_dir() => {
            Some(PathBuf::from(DEFAULT_RECIPES))
        }
        None => None,
    };
    if let Some(dir) = dir {
        let found = recipes::find(&dir)
            .map_err(|e| UserError::new(e.to_string(), Some("check the directory's permissions")))?;
        for path in found {
            if !files.iter().any(|(p, _)| p == &path) {
                files.push((path, false));
            }
        }
    }
    Ok(files)
}

const OK: &str = "✓";
const NO: &str = "✗";
const WARN: &str = "!";

/// The report as sections of aligned lines.
fn render(report: &Report) -> String {
    let m = &report.machine;
    let mut out = String::new();

    let mut rows = Vec::new();
    // A GPU that shares the CPU's memory (a GB10) has no memory of its own to report:
    // what it can use is the machine's RAM, less what the OS and the rest take.
    let ram = m.engines.native.cpu.memory_bytes;
    for g in &m.gpus {
        let mut memory = match (g.memory_bytes, g.unified_memory, ram) {
            (Some(bytes), false, _) => gib(bytes),
            (Some(bytes), true, _) => format!("{} unified", gib(bytes)),
            (None, _, Some(ram)) => format!("unified memory: shares the {} of RAM", gib(ram)),
            (None, _, None) => "unified memory".to_owned(),
        };
        if let Some(free) = g.memory_free_bytes {
            memory.push_str(&format!(", {} free", gib(free)));
        }
        rows.push(vec![
            OK.to_owned(),
            format!("cuda:{}", g.index),
            g.name.clone(),
            memory,
            format!("compute capability {}", g.compute_capability),
            if g.native_fp4 {
                "native FP4"
            } else {
                "no native FP4"
            }
            .to_owned(),
        ]);
    }
    let mut lines = columns(&rows);
    let d = &m.driver;
    if let Some(source) = d.source {
        let cuda = d
            .cuda
            .as_deref()
            .map(|c| format!(", CUDA {c}"))
            .unwrap_or_default();
        lines.push(format!(
            "  driver {}{cuda} (from {source})",
            d.version.as_deref().unwrap_or("version unknown")
        ));
    }
    if let Some(problem) = &d.problem {
        let mark = if m.gpus.is_empty() { NO } else { WARN };
        lines.push(format!("{mark} {problem}"));
    }
    section(&mut out, "GPUs", &lines);

    let e = &m.engines;
    let mut rows = vec![
        installed_row("vllm", &e.vllm),
        installed_row("sglang", &e.sglang),
        installed_row("trtllm", &e.trtllm),
    ];
    let cpu = &e.native.cpu;
    let memory = cpu
        .memory_bytes
        .map(|b| format!(", {} RAM", gib(b)))
        .unwrap_or_default();
    rows.push(vec![
        OK.to_owned(),
        "native".to_owned(),
        e.native.version.to_owned(),
        format!(
            "built in: {} ({}), {} threads{memory}, {} kernels, {}",
            cpu.model, cpu.arch, cpu.threads, cpu.kernels, cpu.huge_pages
        ),
    ]);
    if let Some(b) = &cpu.read_bandwidth {
        rows.push(vec![
            String::new(),
            String::new(),
            String::new(),
            format!(
                "reads memory at {:.1} GB/s with {} threads (median; best {:.1}): one sequence decodes at most {:.1} tok/s per GB read a step",
                b.median_gb_per_s, b.threads, b.best_gb_per_s, b.median_gb_per_s
            ),
        ]);
    }
    if let Some(h) = &cpu.host_memory {
        let pressure = match (h.pressure_some_percent, h.pressure_full_percent) {
            (Some(some), Some(full)) => {
                format!("; memory pressure over 10 s: some {some:.1} %, full {full:.1} %")
            }
            _ => String::new(),
        };
        rows.push(vec![
            String::new(),
            String::new(),
            String::new(),
            format!(
                "host memory: {} available of {} (page cache {}, free {}){pressure}",
                gib(h.available_bytes),
                gib(h.total_bytes),
                gib(h.page_cache_bytes),
                gib(h.free_bytes)
            ),
        ]);
    }
    let families: Vec<&str> = e
        .native
        .architectures
        .iter()
        .map(|a| a.trim_end_matches("ForCausalLM"))
        .collect();
    rows.push(vec![
        String::new(),
        String::new(),
        String::new(),
        format!("runs {}", families.join(", ")),
    ]);
    section(&mut out, "Engines", &columns(&rows));

    let c = &m.containers;
    let rows = vec![
        container_row("docker", &c.docker),
        container_row("podman", &c.podman),
    ];
    section(&mut out, "Containers", &columns(&rows));

    let hub = &m.hub;
    let (mark, status) = match (hub.reachable, hub.status) {
        (None, _) => ("-", "not asked: HF_HUB_OFFLINE is set".to_owned()),
        (Some(true), Some(status)) => (OK, format!("HTTP {status} in {} ms", hub.latency_ms.unwrap_or(0))),
        _ => (NO, hub.error.clone().unwrap_or_else(|| "no answer".into())),
    };
    let lines = vec![
        format!("{mark} {}  {status}", hub.endpoint),
        format!("  token: {}", hub.token),
    ];
    section(&mut out, "Hub", &lines);

    let rows: Vec<Vec<String>> = m
        .disk
        .iter()
        .map(|d| {
            let (mark, free) = match (d.available_bytes, &d.problem) {
                (Some(bytes), _) => (if d.low { NO } else { OK }, format!("{} free", gib(bytes))),
                (None, problem) => (NO, problem.clone().unwrap_or_default()),
            };
            vec![mark.to_owned(), d.what.to_owned(), free, d.path.clone()]
        })
        .collect();
    section(&mut out, "Disk", &columns(&rows));

    if !report.recipes.is_empty() {
        let rows: Vec<Vec<String>> = report
            .recipes
            .iter()
            .map(|r| {
                vec![
                    if r.can_run { OK } else { NO }.to_owned(),
                    r.path.clone(),
                    r.engine.unwrap_or("?").to_owned(),
                ]
            })
            .collect();
        let heads = columns(&rows);
        let mut lines = Vec::new();
        for (head, r) in heads.into_iter().zip(&report.recipes) {
            lines.push(head);
            lines.extend(r.reasons.iter().map(|why| format!("    {NO} {why}")));
            lines.extend(r.warnings.iter().map(|w| format!("    {WARN} {w}")));
        }
        let runnable = report.recipes.iter().filter(|r| r.can_run).count();
        lines.push(format!(
            "{runnable} of {} recipes can run here.",
            report.recipes.len()
        ));
        section(&mut out, "Recipes", &lines);
    }
    out.trim_end().to_owned()
}

fn installed_row(name: &str, e: &Installed) -> Vec<String> {
    let mark = if e.available { OK } else { NO };
    let version = e
        .version
        .clone()
        .unwrap_or_else(|| if e.available { "?" } else { "missing" }.to_owned());
    let detail = match (&e.path, &e.problem) {
        (Some(path), Some(problem)) if e.available => format!("{path} ({problem})"),
        (_, Some(problem)) => problem.clone(),
        (Some(path), None) => path.clone(),
        (None, None) => String::new(),
    };
    vec![mark.to_owned(), name.to_owned(), version, detail]
}

fn container_row(name: &str, c: &ContainerRuntime) -> Vec<String> {
    let mark = match (c.available, c.gpu) {
        (true, true) => OK,
        (true, false) => WARN,
        _ => NO,
    };
    let version = c
        .version
        .clone()
        .unwrap_or_else(|| if c.available { "?" } else { "missing" }.to_owned());
    let detail = match (&c.gpu_via, &c.problem) {
        (Some(via), _) => format!("GPUs via {via}"),
        (None, Some(problem)) => problem.clone(),
        (None, None) => String::new(),
    };
    vec![mark.to_owned(), name.to_owned(), version, detail]
}

/// `title`, then its lines indented, then a blank line.
fn section(out: &mut String, title: &str, lines: &[String]) {
    out.push_str(title);
    out.push('\n');
    for line in lines {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
}

/// Rows with every column left-aligned and padded to its widest cell (the first is the
/// ✓/✗ mark, one space from the next), laid out by the tables' one layout.
fn columns(rows: &[Vec<String>]) -> Vec<String> {
    let joined: Vec<Vec<String>> = rows
        .iter()
        .map(|row| match row.split_first() {
            Some((mark, rest)) if !rest.is_empty() => {
                let mut cells = vec![format!("{mark} {}", rest[0])];
                cells.extend(rest[1..].iter().cloned());
                cells
            }
            _ => row.clone(),
        })
        .collect();
    let width = joined.iter().map(Vec::len).max().unwrap_or(0);
    sous::bench::table::layout_left(&joined, "", width)
        .lines()
        .map(str::to_owned)
        .collect()
}
