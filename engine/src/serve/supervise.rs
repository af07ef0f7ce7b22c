//! The supervisor of one instance: launch exactly the rendered command, wait for
//! readiness, fall back to a lower memory fraction when the engine dies of OOM at
//! start-up, record the instance and stop the one it replaces once ready, restart the
//! engine with backoff when it crashes later, stop it before the host's available
//! memory falls below `memory.host_floor` (then fall back as after an OOM), and stop
//! it (and everything it forked) when asked.
//!
//! It runs as a task of its own; [`super::Instance`] is its handle. What it does is
//! told through the [`Reporter`].

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::error::ServeError;
use super::floor::{self, Crossing};
use super::instance::{self, InstanceState};
use super::logscan::{self, Capacity, PhaseTime};
use super::process;
use super::ready::wait_ready;
use super::starts;
use super::{Launched, Ready};
use crate::device::DeviceMemory;
use crate::launch::{self, Arg, Launch, caches};
use crate::recipe::{EngineKind, RESTART_WINDOW, Recipe};
use crate::reporter::Reporter;

/// Runs the instance until `stop` fires (or its sender is dropped) or the engine
/// crashes too often. `ready` is told once, when the engine first answers.
pub(super) async fn supervise(
    job: Launched,
    mut stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<Ready>,
) -> Result<(), ServeError> {
    let Launched {
        recipe,
        ctx,
        recipe_hash,
        replacing,
        reporter,
        prepared,
    } = job;
    let super::Prepared {
        planned_kv_tokens,
        devices,
        build_phases,
    } = prepared;
    // The build's phases belong to the first start only.
    let mut build_phases = Some(build_phases);
    let mut ready = Some(ready);
    let mut replacing = replacing;
    // What the engine is given: the built weights when there are some.
    let served = launch::served_recipe(&recipe, &ctx).into_owned();
    let sharing = replacing
        .as_ref()
        .is_some_and(|old| old.port == Some(recipe.server.port));
    let (host, port) = (recipe.server.connect_host(), recipe.server.port);
    // vLLM and the native engine bind with SO_REUSEPORT: a second server on a port in
    // use would start and share its connections instead of failing.
    if !sharing
        && let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
    {
        return Err(ServeError::PortInUse(port));
    }
    floor::check(recipe.memory.host_floor)?;
    let host_floor = host_floor(&recipe, &devices, reporter.as_ref());
    let io = |action: &'static str, path: PathBuf| move |source| ServeError::Io { action, path, source };
    std::fs::create_dir_all(&ctx.instance_dir).map_err(io("creating", ctx.instance_dir.clone()))?;
    let log_path = ctx.instance_dir.join("engine.log");
    let prefix = recipe.engine.kind.as_str();
    let fractions: Vec<Option<f64>> = std::iter::once(recipe.memory.gpu_utilization)
        .chain(recipe.memory.oom_fallback.iter().copied().map(Some))
        .collect();
    // The first fraction whose memory can be had now is chosen before any start.
    let mut fraction = 0;
    if let Some((pool, default)) = super::preflight::pool_for(&recipe, &devices)? {
        if pool.device {
            reporter.status("memory", &pool.describe());
        }
        let (first, warning) = floor::fitting(&fractions, default, &pool)?;
        if let Some(warning) = warning {
            reporter.warn(&warning);
        }
        fraction = first;
    }
    let mut attempt = 0;
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    loop {
        attempt += 1;
        let utilization = fractions[fraction];
        let mut current = recipe.clone();
        current.memory.gpu_utilization = utilization;
        // The fallbacks still to come: the native engine reads its recipe back, and a
        // fallback not below the fraction it starts with is invalid there.
        current.memory.oom_fallback = fractions[fraction + 1..].iter().flatten().copied().collect();
        let launch = launch::render(&current, &ctx)?;
        write_files(&launch)?;
        let (argv, env) = resolve(&launch)?;
        let at = utilization.map_or(String::new(), |u| format!(" at memory fraction {u}"));
        let again = if attempt > 1 {
            format!(" (attempt {attempt})")
        } else {
            String::new()
        };
        reporter.status(
            "starting",
            &format!("{prefix}{at}{again}; log: {}", log_path.display()),
        );
        // What the kept compile caches hold as this launch begins: a warm start reads
        // them back, a cold one fills them.
        let compile_cache = ctx.compile_cache.as_deref().map(caches::Contents::of);
        let (tx, rx) = mpsc::unbounded_channel();
        let mut engine = process::spawn(&argv, &env, tx).map_err(|source| ServeError::Spawn {
            program: argv.first().cloned().unwrap_or_default(),
            source,
        })?;
        let watch = Arc::new(Mutex::new(Watch::default()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("opening", log_path.clone()))?;
        let pump = tokio::spawn(pump(rx, log, recipe.engine.kind, watch.clone(), reporter.clone()));
        let started = Instant::now();
        // While the old instance listens on the same port, a request there may reach
        // either: readiness also needs the new engine's own listening socket.
        let own_group = (sharing && replacing.is_some()).then(|| engine.pgid()).flatten();

        // Start-up: ready, dead, too slow, or asked to stop.
        let came_up = tokio::select! {
            code = engine.wait() => Err(Down::Exited(code)),
            url = wait_ready(&served, own_group) => Ok(url),
            crossing = floor::crossed(host_floor) => {
                engine.stop(recipe.server.stop_grace).await;
                Err(Down::Floor(crossing))
            }
            _ = tokio::time::sleep(recipe.server.startup_timeout) => {
                engine.stop(recipe.server.stop_grace).await;
                return Err(ServeError::StartupTimeout(recipe.server.startup_timeout));
            }
            _ = &mut stop => {
                stopping(reporter.as_ref(), recipe.server.stop_grace);
                engine.stop(recipe.server.stop_grace).await;
                return Ok(());
            }
        };
        match came_up {
            Err(Down::Floor(crossing)) => {
                let _ = pump.await;
                next_after_floor(&crossing, &fractions, &mut fraction, reporter.as_ref())?;
                continue;
            }
            Err(Down::Exited(code)) => {
                let _ = pump.await;
                let seen = watch.lock().map(|w| w.clone()).unwrap_or_default();
                // The native engine's start-up refusals carry their own numbers and
                // hint; only a configured fallback list makes them a retry.
                let fallback =
                    recipe.engine.kind != EngineKind::Native || !recipe.memory.oom_fallback.is_empty();
                if let Some(message) = seen.oom.filter(|_| fallback) {
                    if fraction + 1 < fractions.len() {
                        fraction += 1;
                        if let Some(next) = fractions[fraction] {
                            reporter.warn(&format!(
                                "the engine ran out of memory at start-up{}; retrying with `memory.gpu_utilization = {next}`",
                                utilization.map_or(String::new(), |f| format!(" with memory fraction {f}"))
                            ));
                        }
                        continue;
                    }
                    return Err(ServeError::OomExhausted {
                        tried: tried(&fractions),
                        message,
                    });
                }
                return Err(ServeError::ExitedEarly {
                    code,
                    tail: seen.tail.iter().cloned().collect::<Vec<_>>().join("\n"),
                });
            }
            Ok(url) => {
                let (capacity, logged) = watch
                    .lock()
                    .map(|w| (w.capacity.clone(), w.phases.clone()))
                    .unwrap_or_default();
                let phases: Vec<PhaseTime> = build_phases
                    .take()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(logged)
                    .collect();
                let seconds = started.elapsed().as_secs_f64();
                let state = InstanceState {
                    name: recipe.name.clone(),
                    sous_pid: std::process::id(),
                    sous_started: instance::process_start(std::process::id()),
                    engine_pid: engine.pid(),
                    engine: Some(recipe.engine.kind),
                    runtime: Some(recipe.engine.runtime),
                    port: Some(recipe.server.port),
                    url: url.clone(),
                    recipe_hash: recipe_hash.clone(),
                    utilization,
                    stop_grace_ms: Some(recipe.server.stop_grace.as_millis() as u64),
                    model: Some(model_label(&recipe)),
                    weights: ctx.weights.clone(),
                    phases: phases.clone(),
                    ready_unix: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .ok()
                        .map(|d| d.as_secs()),
                };
                instance::write(&ctx.instance_dir, &state)?;
                let start = starts::Start {
                    ready_unix: state.ready_unix.unwrap_or_default(),
                    engine: recipe.engine.kind,
                    version: launch.version.clone(),
                    gpu: devices.first().map(|d| d.name.clone()),
                    seconds,
                    phases: phases.clone(),
                    compile_cache,
                };
                if let Err(e) = starts::record(&ctx.instance_dir, &start) {
                    reporter.warn(&format!(
                        "the start was not recorded in {}: {e}",
                        ctx.instance_dir.join(starts::FILE).display()
                    ));
                }
                reporter.status(
                    "ready",
                    &ready_line(
                        &url,
                        seconds,
                        &phases,
                        utilization,
                        capacity.as_ref(),
                        planned_kv_tokens,
                    ),
                );
                if let (Some(c), Some(planned)) = (&capacity, planned_kv_tokens)
                    && c.tokens != planned
                {
                    reporter.warn(&format!(
                        "the engine's KV cache holds {} tokens, `sous plan` predicted {planned}: the engine sized its memory differently from the plan's model of it",
                        c.tokens
                    ));
                }
                if let Some(old) = replacing.take() {
                    let took = old.stop(old.grace()).await;
                    reporter.status(
                        "replaced",
                        &format!(
                            "the previous instance (sous pid {}) stopped {:.1} s after this one was ready",
                            old.sous_pid,
                            took.as_secs_f64()
                        ),
                    );
                }
                if let Some(tell) = ready.take() {
                    let _ = tell.send(Ready {
                        url,
                        seconds,
                        phases,
                        utilization,
                        capacity,
                        compile_cache,
                    });
                }
            }
        }

        // Serving: until it crashes, the host's memory runs low, or the instance is
        // asked to stop.
        let code = tokio::select! {
            code = engine.wait() => code,
            crossing = floor::crossed(host_floor) => {
                engine.stop(recipe.server.stop_grace).await;
                let _ = pump.await;
                instance::remove_own(&ctx.instance_dir);
                next_after_floor(&crossing, &fractions, &mut fraction, reporter.as_ref())?;
                continue;
            }
            _ = &mut stop => {
                stopping(reporter.as_ref(), recipe.server.stop_grace);
                engine.stop(recipe.server.stop_grace).await;
                instance::remove_own(&ctx.instance_dir);
                return Ok(());
            }
        };
        engine.kill_group();
        let _ = pump.await;
        instance::remove_own(&ctx.instance_dir);
        let now = Instant::now();
        crashes.push_back(now);
        while crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > RESTART_WINDOW)
        {
            crashes.pop_front();
        }
        let used = crashes.len() as u32;
        if used > recipe.engine.restarts {
            return Err(ServeError::GaveUp {
                restarts: recipe.engine.restarts,
                code,
                log: log_path,
            });
        }
        let after = Duration::from_secs(1 << (used - 1).min(6));
        reporter.warn(&format!(
            "the engine exited with code {code}; restarting in {} s ({} restarts left)",
            after.as_secs(),
            recipe.engine.restarts - used
        ));
        tokio::select! {
            _ = tokio::time::sleep(after) => {}
            _ = &mut stop => {
                reporter.status("stopping", "before the engine's restart");
                return Ok(());
            }
        }
    }
}

/// Where a unified-memory GPU's engine is stopped when `memory.host_floor` is unset: a
/// thirty-second of the host's memory (3.8 GiB of a DGX Spark's 121.69 GiB), enough
/// for the OS and sous to go on while the engine is stopped.
const UNIFIED_FLOOR_SHARE: u64 = 32;

/// The floor the supervisor keeps: the recipe's, or on unified memory a default
/// (said once) when the host can keep it.
fn host_floor(recipe: &Recipe, devices: &[DeviceMemory], reporter: &dyn Reporter) -> Option<u64> {
    if recipe.memory.host_floor.is_some() || !devices.iter().any(|d| d.unified) {
        return recipe.memory.host_floor;
    }
    let meminfo = crate::host::Meminfo::read().ok()?;
    let floor = meminfo.total / UNIFIED_FLOOR_SHARE;
    if floor >= meminfo.available {
        reporter.warn(&format!(
            "the GPU shares the host's memory, and only {} of it is available: not watching it (`memory.host_floor` sets a floor to keep)",
            crate::size::gib(meminfo.available)
        ));
        return None;
    }
    reporter.status(
        "watching",
        &format!(
            "the host's available memory: the engine is stopped below {} (unified memory; `memory.host_floor` sets another floor)",
            crate::size::gib(floor)
        ),
    );
    Some(floor)
}

/// Why the engine went down before it was ready.
enum Down {
    /// It exited with this code.
    Exited(i32),
    /// The supervisor stopped it: the host's memory fell below the floor.
    Floor(Crossing),
}

/// After the engine was stopped at the host-memory floor: on to the next fraction of
/// `memory.oom_fallback`, as after an out-of-memory start, or the error when none is
/// left.
fn next_after_floor(
    crossing: &Crossing,
    fractions: &[Option<f64>],
    fraction: &mut usize,
    reporter: &dyn Reporter,
) -> Result<(), ServeError> {
    let what = crossing.describe();
    if let Some(Some(next)) = fractions.get(*fraction + 1) {
        *fraction += 1;
        reporter.warn(&format!(
            "{what}: stopped the engine; starting it again with `memory.gpu_utilization = {next}`"
        ));
        return Ok(());
    }
    Err(ServeError::FloorExhausted {
        tried: tried(fractions),
        crossing: what,
    })
}

/// The fractions tried, for an error: `0.9, 0.85`.
fn tried(fractions: &[Option<f64>]) -> String {
    fractions
        .iter()
        .map(|f| f.map_or("the engine's default".to_owned(), |f| f.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The recipe's model as its file names it, for the instance record: `org/name`,
/// `org/name@revision` or the local directory.
fn model_label(recipe: &Recipe) -> String {
    let model = &recipe.model;
    match (&model.path, &model.repo, &model.revision) {
        (Some(path), _, _) => path.clone(),
        (None, Some(repo), Some(rev)) => format!("{}@{rev}", repo.as_str()),
        (None, Some(repo), None) => repo.as_str().to_owned(),
        (None, None, _) => model.served_name.clone(),
    }
}

fn stopping(reporter: &dyn Reporter, grace: Duration) {
    reporter.status(
        "stopping",
        &format!(
            "the engine: SIGTERM, then SIGKILL if it is still running after {} s",
            grace.as_secs_f64()
        ),
    );
}

/// `http://… after 12.3 s (weights 4.1 s, engine init 6.2 s), memory fraction 0.9, KV
/// cache 450000 tokens, max concurrency 54.93x`.
fn ready_line(
    url: &str,
    seconds: f64,
    phases: &[PhaseTime],
    utilization: Option<f64>,
    capacity: Option<&Capacity>,
    planned: Option<u64>,
) -> String {
    let fraction = utilization.map_or(String::new(), |u| format!(", memory fraction {u}"));
    let kv = capacity.map_or(String::new(), |c| {
        let concurrency = c
            .max_concurrency
            .map_or(String::new(), |x| format!(", max concurrency {x}x"));
        let plan = planned.map_or(String::new(), |p| format!(" (plan: {p})"));
        format!(", KV cache {} tokens{plan}{concurrency}", c.tokens)
    });
    let phases = if phases.is_empty() {
        String::new()
    } else {
        let each: Vec<String> = phases
            .iter()
            .map(|p| format!("{} {:.1} s", p.phase.label(), p.seconds))
            .collect();
        format!(" ({})", each.join(", "))
    };
    format!("{url} after {seconds:.1} s{phases}{fraction}{kv}")
}

/// What the output has shown so far.
#[derive(Debug, Clone, Default)]
struct Watch {
    oom: Option<String>,
    capacity: Option<Capacity>,
    phases: Vec<PhaseTime>,
    tail: VecDeque<String>,
}

async fn pump(
    mut rx: mpsc::UnboundedReceiver<String>,
    mut log: std::fs::File,
    kind: EngineKind,
    watch: Arc<Mutex<Watch>>,
    reporter: Arc<dyn Reporter>,
) {
    use std::io::Write;
    while let Some(line) = rx.recv().await {
        let _ = writeln!(log, "{line}");
        if let Ok(mut w) = watch.lock() {
            if w.oom.is_none() && logscan::is_oom(&line) {
                w.oom = Some(line.trim().to_owned());
            }
            if let Some(c) = logscan::capacity(kind, &line) {
                w.capacity = Some(c);
            }
            w.phases.extend(logscan::phases(&line));
            w.tail.push_back(line.clone());
            if w.tail.len() > 20 {
                w.tail.pop_front();
            }
        }
        reporter.output(Some(kind.as_str()), &line);
    }
}

fn write_files(launch: &Launch) -> Result<(), ServeError> {
    for file in &launch.files {
        if let Some(dir) = file.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ServeError::Io {
                action: "creating",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&file.path, &file.contents).map_err(|source| ServeError::Io {
            action: "writing",
            path: file.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Environment variables for a process.
type EnvPairs = Vec<(String, String)>;

/// The argv and environment with secrets read from sous's environment.
fn resolve(launch: &Launch) -> Result<(Vec<String>, EnvPairs), ServeError> {
    let value = |arg: &Arg| match arg {
        Arg::Lit(s) => Ok(s.clone()),
        Arg::FromEnv(var) => crate::env::named(var).ok_or_else(|| ServeError::MissingEnv(var.clone())),
    };
    let argv = launch.argv.iter().map(value).collect::<Result<_, _>>()?;
    let env = launch
        .env
        .iter()
        .map(|(k, v)| value(v).map(|v| (k.clone(), v)))
        .collect::<Result<_, _>>()?;
    Ok((argv, env))
}
