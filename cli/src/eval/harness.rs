//! Task accuracy by lm-evaluation-harness (EleutherAI's `lm_eval`), not by code of our
//! own: `lm_eval --model local-completions` pointed at the served endpoint, its results
//! file read back into the eval report. The harness tokenizes through the server's
//! `/tokenize` family when it answers (`tokenizer_backend=remote`: the native engine
//! always does, vLLM with `--enable-tokenizer-info-endpoint`), else with the model's
//! tokenizer from its directory (`tokenizer_backend=huggingface`, which needs
//! transformers beside lm_eval).
//!
//! sous ships one small task (`sous_capitals`, in `tasks/`) whose data is in the binary,
//! so that the path runs where no dataset can be downloaded; any public task name
//! (`hellaswag`, `arc_easy`, ...) is passed to the harness as is, which downloads its
//! data from the Hugging Face Hub.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::EvalError;
use super::score::Server;

/// The task sous ships: its YAML and its data.
const SHIPPED: [(&str, &str, &str); 1] = [(
    "sous_capitals",
    include_str!("tasks/sous_capitals.yaml"),
    include_str!("tasks/sous_capitals.jsonl"),
)];

/// The tasks sous ships, by name.
pub fn shipped_tasks() -> Vec<&'static str> {
    SHIPPED.iter().map(|(name, _, _)| *name).collect()
}

/// One metric of one task, as the harness reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The metric (`acc`, `acc_norm`, `exact_match`, ...).
    pub name: String,
    /// The harness's filter (`none` for most tasks).
    pub filter: String,
    /// The value.
    pub value: f64,
    /// Its standard error, when the harness gives one.
    pub stderr: Option<f64>,
}

/// One task's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task.
    pub task: String,
    /// Documents evaluated.
    pub samples: Option<u64>,
    /// Its metrics.
    pub metrics: Vec<Metric>,
}

/// How to run the harness.
#[derive(Debug, Clone)]
pub struct Harness {
    /// The `lm_eval` executable.
    pub program: PathBuf,
    /// Tasks, comma-separated as the harness takes them.
    pub tasks: Vec<String>,
    /// Documents per task at most (`--limit`).
    pub limit: Option<usize>,
    /// Folders of task YAML files of the user's (`--include_path`).
    pub include: Vec<PathBuf>,
    /// Where its output and log go.
    pub out: PathBuf,
    /// The model's tokenizer directory, for servers without `/tokenizer_info`.
    pub tokenizer_dir: Option<PathBuf>,
}

/// The `lm_eval` program: the one given, else the first on `PATH`.
pub fn find_program(given: Option<&Path>) -> Result<PathBuf, EvalError> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(EvalError::NoHarness {
                looked: p.display().to_string(),
            })
        };
    }
    sous_engine::env::PATH
        .get_os()
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("lm_eval"))
        .find(|p| p.is_file())
        .ok_or(EvalError::NoHarness {
            looked: "lm_eval on PATH".into(),
        })
}

impl Harness {
    /// Runs the tasks against `server` and reads their results.
    pub async fn run(&self, client: &reqwest::Client, server: &Server) -> Result<Vec<TaskResult>, EvalError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| EvalError::State { path, source }
        };
        std::fs::create_dir_all(&self.out).map_err(io(&self.out))?;
        let shipped_dir = self.out.join("tasks");
        let mut include = self.include.clone();
        if self.tasks.iter().any(|t| shipped_tasks().contains(&t.as_str())) {
            write_shipped(&shipped_dir)?;
            include.push(shipped_dir);
        }
        let remote = client
            .get(format!("{}/tokenizer_info", server.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        let mut model_args = format!(
            "base_url={}/v1/completions,model={},num_concurrent=1,max_retries=3",
            server.url, server.model
        );
        if remote {
            model_args.push_str(",tokenizer_backend=remote");
        } else if let Some(dir) = &self.tokenizer_dir {
            model_args.push_str(&format!(
                ",tokenizer_backend=huggingface,tokenizer={}",
                dir.display()
            ));
        }
        let results_dir = self.out.join("results");
        let log_path = self.out.join("lm_eval.log");
        let log = std::fs::File::create(&log_path).map_err(io(&log_path))?;
        let log_err = log.try_clone().map_err(io(&log_path))?;
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(["--model", "local-completions", "--model_args", &model_args])
            .arg("--tasks")
            .arg(self.tasks.join(","))
            .arg("--output_path")
            .arg(&results_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        for dir in &include {
            cmd.arg("--include_path").arg(dir);
        }
        if let Some(n) = self.limit {
            cmd.arg("--limit").arg(n.to_string());
        }
        if let Some(key) = &server.api_key {
            // local-completions reads the key from this variable.
            cmd.env("OPENAI_API_KEY", key);
        }
        let status = cmd.status().await.map_err(|source| EvalError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if !status.success() {
            let tail = std::fs::read_to_string(&log_path)
                .map(|t| {
                    t.lines()
                        .rev()
                        .take(12)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            return Err(EvalError::Harness { log: log_path, tail });
        }
        let file = newest_results(&results_dir).ok_or_else(|| EvalError::Harness {
            log: log_path.clone(),
            tail: format!("no results_*.json under {}", results_dir.display()),
        })?;
        let text = std::fs::read_to_string(&file).map_err(io(&file))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| EvalError::Harness {
            log: file.clone(),
            tail: format!("not JSON: {e}"),
        })?;
        Ok(parse_results(&value))
    }
}

/// Writes the shipped tasks into `dir`, each in its own folder, its YAML pointing at
/// its data by absolute path (the harness resolves data files against its own working
/// directory).
pub fn write_shipped(dir: &Path) -> Result<(), EvalError> {
    for (name, yaml, data) in SHIPPED {
        let folder = dir.join(name);
        let fail = |source| EvalError::State {
            path: folder.clone(),
            source,
        };
        std::fs::create_dir_all(&folder).map_err(fail)?;
        let data_path = folder.join(format!("{name}.jsonl"));
        std::fs::write(&data_path, data).map_err(fail)?;
        let yaml = yaml.replace(
            &format!("test: {name}.jsonl"),
            &format!("test: {}", data_path.display()),
        );
        std::fs::write(folder.join(format!("{name}.yaml")), yaml).map_err(fail)?;
    }
    Ok(())
}

/// The newest `results_*.json` under `dir` (the harness writes one per run, in a folder
/// named after the model).
fn newest_results(dir: &Path) -> Option<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("results_") && n.ends_with(".json"))
            {
                found.push(path);
            }
        }
    }
    // The names carry the time (`results_2026-12-06T01-20-17.889561.json`).
    found.into_iter().max_by(|a, b| a.file_name().cmp(&b.file_name()))
}

/// The tasks of a harness results file: `results.<task>` holds `"<metric>,<filter>"`
/// and `"<metric>_stderr,<filter>"` keys; `n-samples.<task>.effective` the documents.
pub fn parse_results(value: &Value) -> Vec<TaskResult> {
    let Some(results) = value["results"].as_object() else {
        return Vec::new();
    };
    results
        .iter()
        .map(|(task, fields)| {
            let mut metrics = Vec::new();
            if let Some(map) = fields.as_object() {
                for (key, v) in map {
                    let Some((name, filter)) = key.split_once(',') else {
                        continue;
                    };
                    if name.ends_with("_stderr") {
                        continue;
                    }
                    let Some(value) = v.as_f64() else { continue };
                    let stderr = map
                        .get(&format!("{name}_stderr,{filter}"))
                        .and_then(Value::as_f64);
                    metrics.push(Metric {
                        name: name.to_owned(),
                        filter: filter.to_owned(),
                        value,
                        stderr,
                    });
                }
            }
            TaskResult {
                task: task.clone(),
                samples: value["n-samples"][task]["effective"].as_u64(),
                metrics,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_harness_results_file() {
        // The shape lm_eval 0.4.13 writes (`results_<time>.json`).
        let value = serde_json::json!({
            "results": {"sous_capitals": {"name": "sous_capitals", "alias": "sous_capitals", "sample_len": 32,
                "acc,none": 0.625, "acc_stderr,none": 0.0869, "acc_norm,none": 0.46875, "acc_norm_stderr,none": "N/A"}},
            "n-samples": {"sous_capitals": {"original": 32, "effective": 32}}
        });
        let r = parse_results(&value);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].samples, Some(32));
        assert_eq!(r[0].metrics.len(), 2);
        let acc = r[0].metrics.iter().find(|m| m.name == "acc").expect("acc");
        assert_eq!(
            (acc.value, acc.stderr, acc.filter.as_str()),
            (0.625, Some(0.0869), "none")
        );
        let norm = r[0]
            .metrics
            .iter()
            .find(|m| m.name == "acc_norm")
            .expect("acc_norm");
        assert_eq!(norm.stderr, None);
    }

    #[test]
    fn the_shipped_task_points_at_its_data() {
        let dir = tempfile::tempdir().expect("tmp");
        write_shipped(dir.path()).expect("written");
        let yaml =
            std::fs::read_to_string(dir.path().join("sous_capitals/sous_capitals.yaml")).expect("yaml");
        let data = dir.path().join("sous_capitals/sous_capitals.jsonl");
        assert!(yaml.contains(&format!("test: {}", data.display())), "{yaml}");
        let lines = std::fs::read_to_string(data).expect("data");
        for line in lines.lines() {
            let doc: Value = serde_json::from_str(line).expect("a JSON document per line");
            let answer = doc["answer"].as_u64().expect("answer") as usize;
            assert!(answer < doc["choices"].as_array().expect("choices").len());
        }
    }
}
