//! `sous deploy`: every shipped recipe rendered for every target (snapshots); the
//! Kubernetes objects parsed back into `k8s-openapi` types and checked for what the
//! field reports learned (strategy, probe budget, GPUs, `/dev/shm`, secrets by
//! reference only, a content hash that moves only with the recipe, a stable claim);
//! the output checked by the tools that apply it (kubernetes-validate for the oldest
//! and newest Kubernetes the rendering targets, `kubectl kustomize`, docker-compose,
//! `systemd-analyze`); the `--out` directory's rules, `deploy diff`, and the errors.

use std::path::{Path, PathBuf};
use std::process::Command as Std;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, PodSpec, Service};
use serde_yaml_ng::Value;

use sous_engine::launch::image::{self, ImageDefaults};
use sous_engine::recipe::EngineKind;

use crate::util::{Mirror, python, root, run, smollm2, sous};

/// Every shipped recipe, relative to the workspace root.
fn shipped() -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["recipes/dgx-spark", "recipes/local", "recipes/titan"] {
        let mut files: Vec<String> = std::fs::read_dir(root().join(dir))
            .expect("recipes dir")
            .filter_map(|e| e.ok())
            .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
            .filter(|p| p.ends_with(".toml"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// `sous deploy ARGS` with an empty, offline Hub cache unless `envs` say otherwise.
fn deploy(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let cache = tempfile::tempdir().expect("tempdir");
    let mut cmd = sous();
    cmd.arg("deploy")
        .args(args)
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

fn render_ok(args: &[&str]) -> (String, String) {
    let (code, stdout, stderr) = deploy(&[&["render"], args].concat(), &[]);
    assert_eq!(code, 0, "sous deploy render {args:?}: {stderr}");
    (stdout, stderr)
}

/// A recipe that pins its nodes' GPU model (GPU Feature Discovery's label) keys the kept
/// compile caches by it, so that pods on another model never read them.
#[test]
fn the_compile_caches_are_keyed_by_the_gpu_model_the_recipe_pins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recipe = dir.path().join("pinned.toml");
    std::fs::write(
        &recipe,
        format!(
            "extends = \"{}\"\n[deploy]\nnode_selector = {{ \"nvidia.com/gpu.product\" = \"NVIDIA-GB10\" }}\n",
            root().join(DGX).display()
        ),
    )
    .expect("recipe");
    let (stream, stderr) = render_ok(&["--recipe", recipe.to_str().expect("utf-8")]);
    let d: Deployment = kind(&documents(&stream), "Deployment");
    let env = pod_spec(&d).containers[0].env.clone().expect("env");
    let root_of = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
    assert_eq!(
        root_of("VLLM_CACHE_ROOT").as_deref(),
        Some("/var/lib/sous/engines/vllm-0.27.1/nvidia-gb10/vllm"),
        "{stderr}"
    );
}

/// The documents of a YAML stream, by kind.
fn documents(stream: &str) -> Vec<Value> {
    stream
        .split("\n---\n")
        .map(|doc| serde_yaml_ng::from_str::<Value>(doc).expect("each document parses"))
        .collect()
}

fn kind<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in the rendering"));
    serde_yaml_ng::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{kind} does not parse as k8s-openapi's: {e}"))
}

fn pod_spec(d: &Deployment) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

const DGX: &str = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
const TITAN: &str = "recipes/titan/qwen3.8-flash-next.toml";

#[test]
fn every_shipped_recipe_renders_for_every_target() {
    // The local recipes size their volume from the Hub: the mirror serves the test model.
    let model = smollm2();
    let mirror = model
        .as_ref()
        .map(|_| Mirror::start(&root().join("target/models"), &[], &[]));
    for recipe in shipped() {
        if recipe.starts_with("recipes/local") && mirror.is_none() {
            eprintln!("SKIPPED: {recipe} sizes its volume from the test model, which is missing");
            continue;
        }
        for target in ["k8s", "compose", "systemd"] {
            let mut envs = vec![];
            if let Some(m) = &mirror {
                envs.push(("HF_ENDPOINT", m.url.as_str()));
                envs.push(("HF_HUB_OFFLINE", "0"));
            }
            let (code, stdout, stderr) = deploy(&["render", "--recipe", &recipe, "--target", target], &envs);
            assert_eq!(code, 0, "{recipe} for {target}: {stderr}");
            let name = format!(
                "{}-{target}",
                Path::new(&recipe).file_stem().expect("stem").to_string_lossy()
            );
            insta::assert_snapshot!(name, format!("{stdout}\n--- stderr ---\n{stderr}"));
            // Byte-deterministic: the same recipe renders the same bytes again.
            let (_, again, _) = deploy(&["render", "--recipe", &recipe, "--target", target], &envs);
            assert_eq!(stdout, again, "{recipe} for {target} renders differently twice");
        }
    }
}

#[test]
fn the_dgx_spark_recipe_renders_the_reports_system() {
    let (stream, stderr) = render_ok(&["--recipe", DGX]);
    let docs = documents(&stream);
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"].as_str(), Some("dgx-ia"), "{doc:?}");
    }
    let d: Deployment = kind(&docs, "Deployment");
    let spec = d.spec.clone().expect("spec");
    // One instance holding the node's GPU: a surge pod would wait for it forever.
    assert_eq!(spec.strategy.and_then(|s| s.type_).as_deref(), Some("Recreate"));
    assert_eq!(spec.replicas, Some(1));
    // Download (1 h) then start-up (30 min) before the rollout counts as stuck.
    assert!(spec.progress_deadline_seconds.expect("deadline") >= 3600 + 1800);
    let pod = pod_spec(&d);
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    assert_eq!(
        pod.node_selector.expect("node selector")["kubernetes.io/hostname"],
        "gx10-db4d"
    );
    assert!(pod.termination_grace_period_seconds.expect("grace") >= 30);
    let engine = &pod.containers[0];
    let resources = engine.resources.clone().expect("resources");
    let limits = resources.limits.expect("limits");
    let requests = resources.requests.expect("requests");
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert_eq!(requests["nvidia.com/gpu"].0, "1");
    assert_eq!(limits["memory"].0, "120Gi");
    assert_eq!(requests["memory"].0, "64Gi");
    // The report's start-up probe: 180 failures over the hour the recipe gives the
    // start-up, and its container name.
    let startup = engine.startup_probe.clone().expect("startup probe");
    assert_eq!(startup.failure_threshold, Some(180));
    assert_eq!(startup.period_seconds, Some(20));
    assert_eq!(engine.name, "vllm-nvfp4");
    for probe in [
        &engine.readiness_probe,
        &engine.liveness_probe,
        &engine.startup_probe,
    ] {
        let get = probe.clone().and_then(|p| p.http_get).expect("HTTP probe");
        assert_eq!(get.path.as_deref(), Some("/health"));
    }
    // /dev/shm in memory, with a limit.
    let shm = pod
        .volumes
        .clone()
        .expect("volumes")
        .into_iter()
        .find(|v| v.name == "shm")
        .and_then(|v| v.empty_dir)
        .expect("an emptyDir for /dev/shm");
    assert_eq!(shm.medium.as_deref(), Some("Memory"));
    assert!(shm.size_limit.is_some());
    assert!(
        engine
            .volume_mounts
            .clone()
            .expect("mounts")
            .iter()
            .any(|m| m.mount_path == "/dev/shm" && m.name == "shm")
    );
    // The init container downloads into the volume, with the marker; the caches live there.
    let init = pod.init_containers.clone().expect("init containers");
    assert_eq!(
        init[0].command.clone().expect("command"),
        ["/usr/local/bin/sous", "pull", "--recipe", "/etc/sous/recipe.toml"]
    );
    let env_of = |name: &str| {
        engine
            .env
            .clone()
            .expect("env")
            .into_iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value)
    };
    // The compile caches on the data volume, keyed by the release; the nodes' GPU model
    // is not pinned, so by no GPU.
    assert_eq!(
        env_of("VLLM_CACHE_ROOT").as_deref(),
        Some("/var/lib/sous/engines/vllm-0.27.1/any-gpu/vllm")
    );
    assert_eq!(
        env_of("TRITON_CACHE_DIR").as_deref(),
        Some("/var/lib/sous/engines/vllm-0.27.1/any-gpu/triton")
    );
    assert_eq!(env_of("HF_HOME").as_deref(), Some("/var/lib/sous/huggingface"));
    // One rendering code path: the container runs exactly what `sous serve --dry-run` prints.
    let (code, dry, dry_err) = run(sous().args(["serve", "--dry-run", "--json", "--recipe", DGX]));
    assert_eq!(code, 0, "{dry_err}");
    let dry: serde_json::Value = serde_json::from_str(&dry).expect("json");
    let argv: Vec<String> = dry["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .map(|a| a.as_str().expect("str").to_owned())
        .collect();
    assert_eq!(engine.command.clone().expect("command"), argv);
    assert_eq!(engine.image.as_deref(), Some("vllm/vllm-openai:v0.27.1"));
    // No `served_name`: vLLM names the model by its path, as the report's clients call it.
    assert_eq!(argv[..3], ["vllm", "serve", "/models/qwen3.8-27b-inferact-nvfp4"]);
    assert!(!argv.iter().any(|a| a == "--served-model-name"), "{argv:?}");

    // The recipe's ConfigMap is named by the same hash the pods carry.
    let cm: ConfigMap = kind(&docs, "ConfigMap");
    let hash = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .and_then(|m| m.annotations)
        .expect("annotations")["sous.dev/recipe-hash"]
        .clone();
    assert_eq!(
        cm.metadata.name.as_deref(),
        Some(format!("qwen3-8-27b-recipe-{hash}").as_str())
    );
    assert_eq!(cm.immutable, Some(true));
    // The model volume survives pruning.
    let pvc: PersistentVolumeClaim = kind(&docs, "PersistentVolumeClaim");
    let annotations = pvc.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations["kustomize.toolkit.fluxcd.io/prune"], "disabled");
    assert_eq!(annotations["argocd.argoproj.io/sync-options"], "Prune=false");
    let svc: Service = kind(&docs, "Service");
    let port = &svc.spec.clone().and_then(|s| s.ports).expect("ports")[0];
    assert_eq!(port.port, 8000);
    // What the reports learned, said where it applies.
    for lesson in ["local-path", "unified-memory", "oom_fallback", "a branch"] {
        assert!(stderr.contains(lesson), "no warning about {lesson}: {stderr}");
    }
}

#[test]
fn the_oom_fallback_is_one_line_on_kubernetes() {
    let annotation = |stream: &str| {
        let d: Deployment = kind(&documents(stream), "Deployment");
        d.metadata
            .annotations
            .unwrap_or_default()
            .get("sous.dev/oom-fallback")
            .cloned()
    };
    let argv = |stream: &str| {
        let d: Deployment = kind(&documents(stream), "Deployment");
        pod_spec(&d).containers[0].command.clone().expect("command")
    };
    let utilization = |argv: &[String]| {
        let at = argv
            .iter()
            .position(|a| a == "--gpu-memory-utilization")
            .expect("--gpu-memory-utilization");
        argv[at + 1].clone()
    };
    // The tuned recipe: 0.90, and 0.85 after an out-of-memory start.
    let (tuned, stderr) = render_ok(&["--recipe", DGX]);
    assert_eq!(utilization(&argv(&tuned)), "0.9");
    let note = annotation(&tuned).expect("an annotation naming the fallback");
    assert!(
        note.contains("sous deploy render --set memory.gpu_utilization=0.85"),
        "{note}"
    );
    assert!(stderr.contains("--set memory.gpu_utilization=0.85"), "{stderr}");
    // The one line: the recipe's fallback is the step taken, none is left.
    let (stepped, stderr) = render_ok(&["--recipe", DGX, "--set", "memory.gpu_utilization=0.85"]);
    assert_eq!(utilization(&argv(&stepped)), "0.85");
    assert_eq!(annotation(&stepped), None);
    assert!(!stderr.contains("oom_fallback"), "{stderr}");
    // A value that is not a step of the recipe is still checked against the rest.
    let (code, _, stderr) = deploy(
        &[
            "render",
            "--recipe",
            DGX,
            "--set",
            "memory.gpu_utilization=0.9",
            "--set",
            "memory.oom_fallback=[0.95]",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("0.95 is not below"), "{stderr}");
    // A probe threshold that gives up before `sous serve` would is said.
    let (_, stderr) = render_ok(&[
        "--recipe",
        DGX,
        "--set",
        "deploy.startup_probe.failure_threshold=10",
    ]);
    assert!(
        stderr.contains("gives up after 10 x 20s = 200s, before `server.startup_timeout` (3600s)"),
        "{stderr}"
    );
}

#[test]
fn the_kv_host_tier_is_in_the_pods_memory() {
    let offload = ["--set", "memory.kv_offload_bytes=100GiB"];
    let (stream, stderr) = render_ok(&[&["--recipe", TITAN][..], &offload].concat());
    assert!(stream.contains("--kv-offloading-size"), "{stream}");
    assert!(
        stderr.contains(
            "`memory.kv_offload_bytes` keeps 100.00 GiB of KV in the engine's host memory: the pods request 100Gi for it"
        ),
        "{stderr}"
    );
    let d: Deployment = kind(&documents(&stream), "Deployment");
    let requests = pod_spec(&d).containers[0]
        .resources
        .clone()
        .and_then(|r| r.requests)
        .expect("requests");
    assert_eq!(requests["memory"].0, "100Gi");
    let (compose, _) = render_ok(&[&["--recipe", TITAN, "--target", "compose"][..], &offload].concat());
    assert!(
        compose.contains(&format!("mem_reservation: {}", 100u64 << 30)),
        "{compose}"
    );
    let (_, stderr) = render_ok(
        &[
            &["--recipe", TITAN, "--set", "deploy.memory_request=64Gi"][..],
            &offload,
        ]
        .concat(),
    );
    assert!(
        stderr.contains("more than `deploy.memory_request` (64Gi) asks for"),
        "{stderr}"
    );
    let (_, stderr) = render_ok(
        &[
            &["--recipe", TITAN, "--set", "deploy.memory_request=128Gi"][..],
            &offload,
        ]
        .concat(),
    );
    assert!(!stderr.contains("kv_offload_bytes"), "{stderr}");
    // systemd: the recipe's limit is the unit's.
    let (units, _) = render_ok(&[
        "--recipe",
        TITAN,
        "--target",
        "systemd",
        "--set",
        "deploy.memory_limit=128Gi",
    ]);
    assert!(
        units.contains(&format!("MemoryMax={}\n", 128u64 << 30)),
        "{units}"
    );
    for target in ["k8s", "compose", "systemd"] {
        let (code, _, stderr) = deploy(
            &[
                &[
                    "render",
                    "--recipe",
                    TITAN,
                    "--target",
                    target,
                    "--set",
                    "deploy.memory_limit=64Gi",
                ][..],
                &offload,
            ]
            .concat(),
            &[],
        );
        assert_eq!(code, 1, "{target}");
        assert!(
            stderr.contains("`deploy.memory_limit` (64Gi) is below `memory.kv_offload_bytes` (100.00 GiB)"),
            "{stderr}"
        );
    }
}

#[test]
fn the_hash_moves_with_the_recipe_and_the_claim_never_does() {
    let (base, _) = render_ok(&["--recipe", DGX]);
    let docs = documents(&base);
    let cm = |docs: &[Value]| kind::<ConfigMap>(docs, "ConfigMap").metadata.name.expect("name");
    let pvc = |docs: &[Value]| {
        serde_yaml_ng::to_string(&kind::<PersistentVolumeClaim>(docs, "PersistentVolumeClaim")).expect("yaml")
    };

    // The same recipe written differently (resolved, comments gone, keys reordered).
    let (code, resolved, stderr) = run(sous().args(["recipe", "check", DGX]));
    assert_eq!(code, 0, "{stderr}");
    let dir = tempfile::tempdir().expect("tempdir");
    let rewritten = dir.path().join("rewritten.toml");
    std::fs::write(&rewritten, &resolved).expect("write");
    let (same, _) = render_ok(&["--recipe", rewritten.to_str().expect("utf-8")]);
    assert_eq!(same, base, "a reformatted recipe renders differently");

    // A changed value: a new ConfigMap and pod hash, the same claim.
    let (changed, _) = render_ok(&["--recipe", DGX, "--set", "memory.gpu_utilization=0.95"]);
    let changed = documents(&changed);
    assert_ne!(cm(&changed), cm(&docs));
    assert_eq!(pvc(&changed), pvc(&docs));

    // An existing claim instead of one sous creates.
    let claimed = dir.path().join("claimed.toml");
    std::fs::write(
        &claimed,
        "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nexisting_claim = \"shared-models\"\n",
    )
    .expect("recipe");
    let (existing, _) = render_ok(&["--recipe", claimed.to_str().expect("utf-8")]);
    let existing = documents(&existing);
    assert!(
        !existing
            .iter()
            .any(|d| d["kind"].as_str() == Some("PersistentVolumeClaim"))
    );
    let volumes = pod_spec(&kind::<Deployment>(&existing, "Deployment"))
        .volumes
        .expect("volumes");
    assert_eq!(
        volumes[0]
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("shared-models")
    );

    // A change of the deployment alone (replicas) rolls nothing by itself.
    let (more, _) = render_ok(&["--recipe", DGX, "--set", "deploy.replicas=2"]);
    let more = documents(&more);
    assert_eq!(cm(&more), cm(&docs));
    let d: Deployment = kind(&more, "Deployment");
    let strategy = d.spec.and_then(|s| s.strategy).expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rolling");
    assert_eq!(
        rolling.max_surge,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
    );
}

#[test]
fn secrets_are_referenced_never_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    for engine in ["vllm", "sglang"] {
        let file = dir.path().join(format!("{engine}.toml"));
        std::fs::write(
            &file,
            format!(
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\nrevision = \"{}\"\n[engine]\nkind = \"{engine}\"\nimage = \"example/{engine}:1\"\n[server]\napi_key_env = \"SOUS_API_KEY\"\n[env]\nLITERAL = \"$(HF_TOKEN) ${{HF_TOKEN}}\"\n[deploy.storage]\nsize = \"20Gi\"\n",
                "a".repeat(40)
            ),
        )
        .expect("recipe");
        let file = file.to_str().expect("utf-8");
        for target in ["k8s", "compose", "systemd"] {
            let (code, out, stderr) = deploy(
                &["render", "--recipe", file, "--target", target],
                &[
                    ("HF_TOKEN", "hf_secret_token_value"),
                    ("SOUS_API_KEY", "sk-secret-key-value"),
                ],
            );
            assert_eq!(code, 0, "{engine} {target}: {stderr}");
            for secret in ["hf_secret_token_value", "sk-secret-key-value"] {
                assert!(
                    !out.contains(secret),
                    "{engine} for {target} wrote a secret:\n{out}"
                );
            }
        }
        let (out, _) = render_ok(&["--recipe", file]);
        let d: Deployment = kind(&documents(&out), "Deployment");
        let engine_env = pod_spec(&d).containers[0].env.clone().expect("env");
        for var in &engine_env {
            if let Some(from) = &var.value_from {
                let secret = from.secret_key_ref.clone().expect("only secrets by reference");
                assert_eq!(secret.name, "qwen3-0-6b-secrets".replace("qwen3-0-6b", engine));
                let optional = secret.optional == Some(true);
                assert_eq!(optional, secret.key == "HF_TOKEN", "{var:?}");
            }
            assert!(
                !(var.name.contains("KEY") || var.name.contains("TOKEN")) || var.value.is_none(),
                "{var:?}"
            );
        }
        // A literal `$` is no reference: doubled, which Kubernetes reads back as one.
        let literal = engine_env
            .iter()
            .find(|e| e.name == "LITERAL")
            .and_then(|e| e.value.clone());
        assert_eq!(literal.as_deref(), Some("$$(HF_TOKEN) $${HF_TOKEN}"));
        let command = pod_spec(&d).containers[0].command.clone().expect("command");
        if engine == "sglang" {
            assert!(command.contains(&"$(SOUS_API_KEY)".to_owned()), "{command:?}");
            assert!(engine_env.iter().any(|e| e.name == "SOUS_API_KEY"));
        } else {
            assert!(engine_env.iter().any(|e| {
                e.name == "VLLM_API_KEY"
                    && e.value_from
                        .as_ref()
                        .and_then(|f| f.secret_key_ref.as_ref())
                        .map(|s| s.key.as_str())
                        == Some("SOUS_API_KEY")
            }));
        }
    }
}

#[test]
fn the_titan_recipe_runs_three_single_gpu_instances() {
    let (stream, _) = render_ok(&["--recipe", TITAN]);
    let docs = documents(&stream);
    let d: Deployment = kind(&docs, "Deployment");
    let spec = d.spec.clone().expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let strategy = spec.strategy.expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rolling");
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));
    let pod = pod_spec(&d);
    assert_eq!(
        pod.containers[0]
            .resources
            .clone()
            .and_then(|r| r.limits)
            .expect("limits")["nvidia.com/gpu"]
            .0,
        "1"
    );
    assert!(
        pod.init_containers.is_none(),
        "a path-only model is not downloaded"
    );
    let model = pod
        .volumes
        .expect("volumes")
        .into_iter()
        .find(|v| v.name == "model")
        .and_then(|v| v.persistent_volume_claim)
        .expect("the model's claim");
    assert_eq!(model.claim_name, "qwen3-8-flash-next-model");
    assert_eq!(model.read_only, Some(true));

    // vLLM's router in front, under the recipe's name; it finds the engine pods by
    // their labels, with the RBAC that needs and nothing more.
    let routers: Vec<Deployment> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| serde_yaml_ng::from_value(d.clone()).expect("Deployment"))
        .collect();
    assert_eq!(routers.len(), 2);
    let router = &routers[1];
    assert_eq!(
        router.metadata.name.as_deref(),
        Some("qwen3-8-flash-next-titan-router")
    );
    let router_pod = pod_spec(router);
    assert_eq!(
        router_pod.service_account_name.as_deref(),
        Some("qwen3-8-flash-next-titan-router")
    );
    let command = router_pod.containers[0]
        .command
        .clone()
        .expect("command")
        .join(" ");
    assert!(
        command.starts_with("vllm-router --host 0.0.0.0 --port 8000 --policy cache_aware "),
        "{command}"
    );
    assert!(
        command.contains(
            "--service-discovery --selector app.kubernetes.io/name=qwen3-8-flash-next-titan \
             --service-discovery-port 8000 --service-discovery-namespace $(POD_NAMESPACE)"
        ),
        "{command}"
    );
    assert_eq!(
        router_pod.containers[0].image.as_deref(),
        Some("vllm-router:0.1.17")
    );
    let services: Vec<Service> = docs
        .iter()
        .filter(|d| d["kind"] == "Service")
        .map(|d| serde_yaml_ng::from_value(d.clone()).expect("Service"))
        .collect();
    let selector_of = |name: &str| {
        services
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .and_then(|s| s.spec.clone())
            .and_then(|s| s.selector)
            .unwrap_or_else(|| panic!("no Service {name}"))
    };
    assert_eq!(
        selector_of("qwen3-8-flash-next-titan")["app.kubernetes.io/name"],
        "qwen3-8-flash-next-titan-router"
    );
    assert_eq!(
        selector_of("qwen3-8-flash-next-titan-engine")["app.kubernetes.io/name"],
        "qwen3-8-flash-next-titan"
    );
    let role = docs.iter().find(|d| d["kind"] == "Role").expect("a Role");
    assert_eq!(role["rules"][0]["resources"][0], "pods");
    assert_eq!(
        role["rules"][0]["verbs"],
        serde_yaml_ng::from_str::<Value>("[get, list, watch]").expect("yaml")
    );
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding")
        .expect("a RoleBinding");
    assert_eq!(binding["subjects"][0]["name"], "qwen3-8-flash-next-titan-router");

    let (compose, stderr) = render_ok(&["--recipe", TITAN, "--target", "compose"]);
    assert!(stderr.contains("docker/router.Dockerfile"), "{stderr}");
    let compose = compose
        .split("# ==> recipe.toml <==")
        .next()
        .expect("compose part");
    let compose: Value = serde_yaml_ng::from_str(compose).expect("compose parses");
    let services = compose["services"].as_mapping().expect("services");
    assert_eq!(services.len(), 4);
    for i in 0..3 {
        let svc = &compose["services"][format!("qwen3-8-flash-next-titan-{i}").as_str()];
        assert_eq!(
            svc["ports"][0].as_str(),
            Some(format!("{}:8000", 8001 + i).as_str())
        );
        assert_eq!(
            svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0].as_str(),
            Some(i.to_string().as_str())
        );
    }
    let router = &compose["services"]["qwen3-8-flash-next-titan-router"];
    assert_eq!(router["ports"][0].as_str(), Some("8000:8000"));
    assert_eq!(router["entrypoint"][0].as_str(), Some("vllm-router"));
    let args: Vec<&str> = router["command"]
        .as_sequence()
        .expect("command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--worker-urls")
        .expect("--worker-urls");
    assert_eq!(
        args[at + 1..at + 4],
        [
            "http://qwen3-8-flash-next-titan-0:8000",
            "http://qwen3-8-flash-next-titan-1:8000",
            "http://qwen3-8-flash-next-titan-2:8000"
        ]
    );

    let (units, _) = render_ok(&["--recipe", TITAN, "--target", "systemd"]);
    for i in 0..3 {
        assert!(units.contains(&format!("# ==> sous-qwen3-8-flash-next-titan-{i}.service <==")));
        assert!(units.contains(&format!("Environment=CUDA_VISIBLE_DEVICES={i}\n")));
        assert!(units.contains(&format!(
            "--set name=qwen3.8-flash-next-titan-{i} --set server.port={}",
            8001 + i
        )));
    }
    assert!(units.contains("# ==> sous-qwen3-8-flash-next-titan-router.service <=="));
    assert!(
        units.contains("--worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 http://127.0.0.1:8003")
    );
    assert!(units.contains("After=network-online.target sous-qwen3-8-flash-next-titan-0.service"));

    // One replica has no router unless the recipe asks; `none` with several is said.
    let (one, _) = render_ok(&[
        "--recipe",
        TITAN,
        "--set",
        "deploy.replicas=1",
        "--set",
        "deploy.router.kind=none",
    ]);
    assert!(!one.contains("kind: Role"), "{one}");
    let (_, stderr) = render_ok(&["--recipe", TITAN, "--set", "deploy.router.kind=none"]);
    assert!(
        stderr.contains("3 replicas with `deploy.router.kind = \"none\"`"),
        "{stderr}"
    );
    // consistent_hash is vllm-router's only.
    let (code, _, stderr) = deploy(
        &[
            "render",
            "--recipe",
            TITAN,
            "--set",
            "deploy.router.kind=sglang-router",
            "--set",
            "deploy.router.policy=consistent_hash",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("`sglang-router` has no `consistent_hash` policy"),
        "{stderr}"
    );
}

/// A recipe across nodes: 16 GPUs, 8 a node.
fn multi_node(dir: &Path, engine: &str, tp: u32) -> PathBuf {
    let file = dir.join(format!("{engine}-{tp}.toml"));
    std::fs::write(
        &file,
        format!(
            "[model]\nrepo = \"deepseek-ai/DeepSeek-V3\"\n[engine]\nkind = \"{engine}\"\nimage = \"example/{engine}:1\"\n[serving]\ntensor_parallel = {tp}\npipeline_parallel = 2\n[deploy]\ngpus_per_node = 8\n[deploy.storage]\nsize = \"1500Gi\"\naccess_mode = \"ReadWriteMany\"\n"
        ),
    )
    .expect("recipe");
    file
}

#[test]
fn an_instance_across_nodes_is_a_leader_worker_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    for engine in ["vllm", "sglang"] {
        let file = multi_node(dir.path(), engine, 8);
        let (stream, _) = render_ok(&["--recipe", file.to_str().expect("utf-8")]);
        let docs = documents(&stream);
        let lws = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("LeaderWorkerSet"))
            .expect("a LeaderWorkerSet");
        assert!(!docs.iter().any(|d| d["kind"].as_str() == Some("Deployment")));
        let template = &lws["spec"]["leaderWorkerTemplate"];
        assert_eq!(template["size"].as_u64(), Some(2));
        assert_eq!(
            template["restartPolicy"].as_str(),
            Some("RecreateGroupOnPodRestart")
        );
        assert_eq!(
            lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"].as_u64(),
            Some(0)
        );
        for role in ["leaderTemplate", "workerTemplate"] {
            let pod: PodSpec = serde_yaml_ng::from_value(template[role]["spec"].clone()).expect("a pod spec");
            let engine_container = &pod.containers[0];
            let gpus = engine_container
                .resources
                .clone()
                .and_then(|r| r.limits)
                .expect("limits");
            assert_eq!(gpus["nvidia.com/gpu"].0, "8", "{role}");
            let command = engine_container.command.clone().expect("command").join(" ");
            match engine {
                "vllm" => assert!(command.contains("multi-node-serving.sh"), "{command}"),
                _ => assert!(command.contains("--nnodes $(LWS_GROUP_SIZE)"), "{command}"),
            }
            assert_eq!(engine_container.startup_probe.is_some(), role == "leaderTemplate");
            // Every pod loads the model: each waits for it to be on the shared volume.
            assert_eq!(pod.init_containers.map(|c| c.len()), Some(1), "{role}");
        }
        let svc: Service = kind(&docs, "Service");
        assert_eq!(
            svc.spec.and_then(|s| s.selector).expect("selector")["sous.dev/role"],
            "leader"
        );
        // One machine cannot hold it.
        for target in ["compose", "systemd"] {
            let (code, _, stderr) = deploy(
                &[
                    "render",
                    "--recipe",
                    file.to_str().expect("utf-8"),
                    "--target",
                    target,
                ],
                &[],
            );
            assert_eq!(code, 1, "{stderr}");
            assert!(stderr.contains("runs one machine"), "{stderr}");
        }
    }
    // A volume one node can mount cannot feed a group across nodes.
    let file = multi_node(dir.path(), "vllm", 8);
    let (code, _, stderr) = deploy(
        &[
            "render",
            "--recipe",
            file.to_str().expect("utf-8"),
            "--set",
            "deploy.storage.access_mode=ReadWriteOnce",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("spans 2 nodes") && stderr.contains("ReadWriteMany"),
        "{stderr}"
    );
    let trtllm = multi_node(dir.path(), "trtllm", 8);
    let (code, _, stderr) = deploy(&["render", "--recipe", trtllm.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("TensorRT-LLM has no multi-node launch"),
        "{stderr}"
    );
    let uneven = multi_node(dir.path(), "vllm", 6);
    let (code, _, stderr) = deploy(&["render", "--recipe", uneven.to_str().expect("utf-8")], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("12 GPUs, which is not a whole number of nodes of 8"),
        "{stderr}"
    );
}

/// Renders the shipped recipes and the multi-node ones into directories, one per
/// recipe and target; returns (directory, target).
fn rendered_dirs(work: &Path, mirror: Option<&Mirror>) -> Vec<(PathBuf, &'static str)> {
    let mut recipes: Vec<PathBuf> = shipped().iter().map(|r| root().join(r)).collect();
    recipes.push(multi_node(work, "vllm", 8));
    recipes.push(multi_node(work, "sglang", 8));
    let router_bin = root().join("target/py/bin/vllm-router");
    let mut dirs = Vec::new();
    for (i, recipe) in recipes.iter().enumerate() {
        let local = recipe.to_string_lossy().contains("recipes/local");
        if local && mirror.is_none() {
            continue;
        }
        for target in ["k8s", "compose", "systemd"] {
            let out = work.join(format!("{i}-{target}"));
            let mut envs = vec![];
            if let Some(m) = mirror {
                envs.push(("HF_ENDPOINT", m.url.as_str()));
                envs.push(("HF_HUB_OFFLINE", "0"));
            }
            let (code, _, stderr) = deploy(
                &[
                    "render",
                    "--recipe",
                    recipe.to_str().expect("utf-8"),
                    "--target",
                    target,
                    "--out",
                    out.to_str().expect("utf-8"),
                    "--sous-bin",
                    env!("CARGO_BIN_EXE_sous"),
                    // The router scripts/python-env.sh installs, for systemd-analyze.
                    "--router-bin",
                    router_bin.to_str().expect("utf-8"),
                    "--set",
                    "deploy.service_monitor=true",
                ],
                &envs,
            );
            if code == 1 && stderr.contains("runs one machine") {
                continue;
            }
            assert_eq!(code, 0, "{recipe:?} for {target}: {stderr}");
            dirs.push((out, target));
        }
    }
    dirs
}

/// Whether `tool` runs here; in CI it must.
fn tool(tool: &str, install: &str) -> bool {
    let found = Std::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing in CI: scripts/test.sh must install {install}"
        );
        eprintln!("SKIPPED: {tool} is not installed ({install})");
    }
    found
}

#[test]
fn the_tools_that_apply_the_output_accept_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let mirror = smollm2().map(|_| Mirror::start(&root().join("target/models"), &[], &[]));
    let dirs = rendered_dirs(work.path(), mirror.as_ref());
    let validate = python("kubernetes-validate").map(|p| p.with_file_name("kubernetes-validate"));
    let compose = tool("docker-compose", "the Debian package docker-compose");
    let systemd = tool("systemd-analyze", "the Debian package systemd");
    let kubectl = Std::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success());
    for (dir, target) in &dirs {
        match *target {
            "k8s" => {
                if let Some(validate) = &validate {
                    let mut files = vec![];
                    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
                        let path = entry.path();
                        let text = std::fs::read_to_string(&path).unwrap_or_default();
                        if !path.to_string_lossy().ends_with(".yaml") || path.ends_with("kustomization.yaml")
                        {
                            continue;
                        }
                        let doc: Value = serde_yaml_ng::from_str(&text).expect("yaml");
                        if doc["kind"].as_str() == Some("LeaderWorkerSet") {
                            // kubernetes-validate has no schema for the CRD: its pod
                            // templates are checked as the Pods they become.
                            for role in ["leaderTemplate", "workerTemplate"] {
                                let t = &doc["spec"]["leaderWorkerTemplate"][role];
                                let pod = serde_json::json!({
                                    "apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": format!("lws-{}", role.to_lowercase())},
                                    "spec": serde_json::to_value(&t["spec"]).expect("json"),
                                });
                                let pod_file = dir.join(format!(".{role}.pod.json"));
                                std::fs::write(&pod_file, pod.to_string()).expect("pod");
                                files.push(pod_file);
                            }
                        } else if doc["kind"].as_str() != Some("ServiceMonitor") {
                            files.push(path);
                        }
                    }
                    for version in ["1.33.0", "1.37.0"] {
                        let out = Std::new(validate)
                            .args(["--strict", "--quiet", "-k", version])
                            .args(&files)
                            .output()
                            .expect("kubernetes-validate runs");
                        assert!(
                            out.status.success(),
                            "kubernetes-validate {version} {dir:?}:\n{}{}",
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                    for f in files
                        .iter()
                        .filter(|f| f.to_string_lossy().ends_with(".pod.json"))
                    {
                        std::fs::remove_file(f).expect("remove");
                    }
                }
                if kubectl {
                    let out = Std::new("kubectl")
                        .arg("kustomize")
                        .arg(dir)
                        .output()
                        .expect("kubectl");
                    assert!(
                        out.status.success(),
                        "kubectl kustomize {dir:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            "compose" if compose => {
                let out = Std::new("docker-compose")
                    .arg("-f")
                    .arg(dir.join("docker-compose.yml"))
                    .args(["config", "-q"])
                    .output()
                    .expect("docker-compose runs");
                assert!(
                    out.status.success() && out.stderr.is_empty(),
                    "docker-compose config {dir:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            "systemd" if systemd => {
                for entry in std::fs::read_dir(dir).expect("dir").flatten() {
                    if !entry.path().to_string_lossy().ends_with(".service") {
                        continue;
                    }
                    let out = Std::new("systemd-analyze")
                        .arg("verify")
                        .arg(entry.path())
                        .output()
                        .expect("systemd-analyze runs");
                    assert!(
                        out.status.success() && out.stderr.is_empty(),
                        "systemd-analyze verify {:?}: {}",
                        entry.path(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            _ => {}
        }
    }
}

#[test]
fn the_out_directory_is_written_whole_and_only_where_sous_owns_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("deploy");
    let out_s = out.to_str().expect("utf-8");
    let (_, stderr) = render_ok(&["--recipe", DGX, "--out", out_s]);
    assert!(stderr.contains("rendered 5 files"), "{stderr}");
    let kustomization = std::fs::read_to_string(out.join("kustomization.yaml")).expect("kustomization");
    for file in ["pvc.yaml", "configmap.yaml", "deployment.yaml", "service.yaml"] {
        assert!(out.join(file).is_file(), "{file}");
        assert!(kustomization.contains(&format!("- {file}\n")), "{kustomization}");
    }
    // For scripts: what a render wrote, and a rendering's files, as JSON.
    let (code, json, stderr) = deploy(&["render", "--recipe", DGX, "--out", out_s, "--json"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["target"], "k8s");
    assert_eq!(json["changed"].as_array().map(Vec::len), Some(0), "{json}");
    assert_eq!(json["unchanged"].as_array().map(Vec::len), Some(5), "{json}");
    let (code, json, stderr) = deploy(&["render", "--recipe", DGX, "--target", "compose", "--json"], &[]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let names: Vec<&str> = json["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert_eq!(names, ["docker-compose.yml", "recipe.toml"]);
    assert!(json["warnings"].as_array().is_some_and(|w| !w.is_empty()));
    // Again: nothing changes, and the diff is empty.
    let (_, stderr) = render_ok(&["--recipe", DGX, "--out", out_s]);
    assert!(stderr.contains("(0 changed)"), "{stderr}");
    let (code, _, stderr) = deploy(&["diff", "--recipe", DGX, out_s], &[]);
    assert_eq!(code, 0, "{stderr}");
    // A changed recipe: the diff names what moves, exit 1.
    let (code, diff, _) = deploy(
        &[
            "diff",
            "--recipe",
            DGX,
            out_s,
            "--set",
            "memory.gpu_utilization=0.95",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(diff.contains("+++ b/deployment.yaml"), "{diff}");
    assert!(
        diff.contains("-        - \"0.9\"") && diff.contains("+        - \"0.95\""),
        "{diff}"
    );
    assert!(!diff.contains("pvc.yaml"), "{diff}");
    // A hand edit of a file sous wrote is not lost silently.
    let deployment = out.join("deployment.yaml");
    let rendered = std::fs::read_to_string(&deployment).expect("deployment");
    std::fs::write(&deployment, rendered.replace("replicas: 1", "replicas: 2")).expect("edit");
    let (code, _, stderr) = deploy(&["render", "--recipe", DGX, "--out", out_s], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("edited since sous rendered") && stderr.contains("deployment.yaml"),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");
    render_ok(&["--recipe", DGX, "--out", out_s, "--force"]);
    assert_eq!(
        std::fs::read_to_string(&deployment).expect("deployment"),
        rendered
    );
    // The operator's own file beside the rendering is theirs.
    std::fs::write(out.join(".env"), "HF_TOKEN=x\n").expect("env");
    // A monitor added, then dropped: its file comes and goes.
    render_ok(&[
        "--recipe",
        DGX,
        "--out",
        out_s,
        "--set",
        "deploy.service_monitor=true",
    ]);
    assert!(out.join("servicemonitor.yaml").is_file());
    let (_, stderr) = render_ok(&["--recipe", DGX, "--out", out_s]);
    assert!(stderr.contains("removed: servicemonitor.yaml"), "{stderr}");
    assert!(!out.join("servicemonitor.yaml").exists());
    assert!(out.join(".env").is_file());

    // A directory sous never rendered into is refused, and nothing is written.
    let foreign = work.path().join("foreign");
    std::fs::create_dir(&foreign).expect("dir");
    std::fs::write(foreign.join("deployment.yaml"), "# mine\n").expect("file");
    let foreign_s = foreign.to_str().expect("utf-8");
    let (code, _, stderr) = deploy(&["render", "--recipe", DGX, "--out", foreign_s], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("holds files sous did not write: deployment.yaml"),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(std::fs::read_dir(&foreign).expect("dir").count(), 1);
    assert_eq!(
        std::fs::read_to_string(foreign.join("deployment.yaml")).expect("file"),
        "# mine\n"
    );
    render_ok(&["--recipe", DGX, "--out", foreign_s, "--force"]);
    assert!(foreign.join("pvc.yaml").is_file());
    // --out naming a file.
    let file = work.path().join("file");
    std::fs::write(&file, "").expect("file");
    let (code, _, stderr) = deploy(
        &["render", "--recipe", DGX, "--out", file.to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("is not a directory"), "{stderr}");
}

#[test]
fn bad_deployments_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("recipe");
        path.to_str().expect("utf-8").to_owned()
    };
    let cases = [
        (
            write(
                "path-only.toml",
                "[model]\npath = \"/models/x\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nsize = \"10Gi\"\n",
            ),
            "k8s",
            &[
                "`model.path` (/models/x) is set without `model.repo`",
                "hint: set `model.repo`",
            ][..],
        ),
        (
            write(
                "unsized.toml",
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[engine]\nkind = \"vllm\"\n",
            ),
            "k8s",
            &["cannot size the model volume", "deploy.storage.size"][..],
        ),
        (
            write(
                "no-image.toml",
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[engine]\nkind = \"sglang\"\n[deploy.storage]\nsize = \"10Gi\"\n",
            ),
            "compose",
            &["`engine.image` is not set", "hint: set `engine.image`"][..],
        ),
        (
            write(
                "relative.toml",
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\npath = \"models/x\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nsize = \"10Gi\"\n",
            ),
            "k8s",
            &["`model.path` (models/x) is relative"][..],
        ),
        (
            write(
                "calibration.toml",
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[quantize]\nscheme = \"nvfp4\"\ncalibration = \"text.txt\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nsize = \"10Gi\"\n",
            ),
            "k8s",
            &[
                "`quantize.calibration` is a file of this machine",
                "text.txt",
                "hint: use `calibration = \"builtin\"`",
            ][..],
        ),
    ];
    for (recipe, target, phrases) in cases {
        let (code, out, stderr) = deploy(&["render", "--recipe", &recipe, "--target", target], &[]);
        assert_eq!(code, 1, "{recipe}: {stderr}");
        assert!(out.is_empty(), "{recipe} printed a partial rendering");
        for phrase in phrases {
            assert!(stderr.contains(phrase), "{recipe}: no {phrase:?} in {stderr}");
        }
    }
    let (code, _, stderr) = deploy(
        &["diff", "--recipe", DGX, dir.path().to_str().expect("utf-8")],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("was not rendered by `sous deploy render --out`"),
        "{stderr}"
    );
}

/// Runs a rendered pod's commands on this machine, its mounts as directories: the
/// volume's and the ConfigMap's paths replaced by temporary ones everywhere (files,
/// commands, environment), the image's sous by this build's.
struct Pod {
    data: PathBuf,
    config: PathBuf,
}

impl Pod {
    fn map(&self, text: &str) -> String {
        text.replace("/usr/local/bin/sous", env!("CARGO_BIN_EXE_sous"))
            .replace("/var/lib/sous", self.data.to_str().expect("utf-8"))
            .replace("/etc/sous", self.config.to_str().expect("utf-8"))
    }

    fn command(&self, container: &k8s_openapi::api::core::v1::Container, hub: &str) -> Std {
        let argv: Vec<String> = container
            .command
            .clone()
            .expect("command")
            .iter()
            .map(|a| self.map(a))
            .collect();
        let mut cmd = Std::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for var in container.env.clone().unwrap_or_default() {
            if let Some(value) = var.value {
                cmd.env(&var.name, self.map(&value));
            }
        }
        cmd.env("HF_ENDPOINT", hub).env("NO_COLOR", "1");
        cmd
    }
}

#[test]
fn a_rendered_pod_pulls_quantizes_and_serves_and_a_restart_downloads_nothing() {
    let Some(_) = smollm2() else { return };
    let _cpu = crate::util::cpu_exclusive();
    let mirror = Mirror::start(&root().join("target/models"), &[], &[]);
    let work = tempfile::tempdir().expect("tempdir");
    let port = crate::util::free_port().to_string();
    let (code, stream, stderr) = deploy(
        &[
            "render",
            "--recipe",
            "recipes/local/smollm2-135m-nvfp4.toml",
            "--set",
            &format!("server.port={port}"),
        ],
        &[("HF_ENDPOINT", mirror.url.as_str()), ("HF_HUB_OFFLINE", "0")],
    );
    assert_eq!(code, 0, "{stderr}");
    let docs = documents(&stream);
    let spec = pod_spec(&kind::<Deployment>(&docs, "Deployment"));
    let pod = Pod {
        data: work.path().join("data"),
        config: work.path().join("config"),
    };
    std::fs::create_dir_all(&pod.data).expect("data");
    std::fs::create_dir_all(&pod.config).expect("config");
    for (name, contents) in kind::<ConfigMap>(&docs, "ConfigMap").data.expect("data") {
        std::fs::write(pod.config.join(name), pod.map(&contents)).expect("config file");
    }
    let init = spec.init_containers.clone().expect("init containers");
    assert_eq!(
        init.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["pull", "quantize"]
    );
    for round in 0..2 {
        mirror.clear();
        for container in &init {
            let out = pod.command(container, &mirror.url).output().expect("init runs");
            assert!(
                out.status.success(),
                "init container {} (round {round}): {}",
                container.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let downloads: Vec<String> = mirror
            .requests()
            .into_iter()
            .filter(|r| r.contains("/resolve/"))
            .collect();
        if round == 0 {
            assert!(!downloads.is_empty(), "the first start downloads the model");
        } else {
            // A restart: the marker is there, nothing is downloaded again.
            assert!(downloads.is_empty(), "a restart downloaded {downloads:?}");
        }
    }
    assert!(
        pod.data
            .join("models/smollm2-135m-nvfp4/.download-complete")
            .is_file()
    );

    let mut engine = pod.command(&spec.containers[0], &mirror.url);
    let mut child = engine
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("engine starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let port: u16 = port.parse().expect("port");
    let mut ready = false;
    while std::time::Instant::now() < deadline {
        if matches!(crate::util::health(port), Ok((200, _))) {
            ready = true;
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the engine container exited: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = Std::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status();
    let status = child.wait().expect("engine exits");
    assert!(ready, "the engine container never answered /health");
    assert!(
        status.success(),
        "the engine container stopped with {status} on SIGTERM"
    );
}

#[test]
fn metrics_are_scraped_where_each_engine_serves_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (engine, path) in [
        ("vllm", "/metrics"),
        ("sglang", "/metrics"),
        ("trtllm", "/prometheus/metrics"),
    ] {
        let file = dir.path().join(format!("{engine}.toml"));
        std::fs::write(
            &file,
            format!(
                "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[engine]\nkind = \"{engine}\"\nimage = \"example/{engine}:1\"\n[deploy]\nservice_monitor = true\n[deploy.storage]\nsize = \"20Gi\"\n"
            ),
        )
        .expect("recipe");
        let (stream, _) = render_ok(&["--recipe", file.to_str().expect("utf-8")]);
        let docs = documents(&stream);
        let monitor = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("ServiceMonitor"))
            .expect("a ServiceMonitor");
        assert_eq!(
            monitor["spec"]["endpoints"][0]["path"].as_str(),
            Some(path),
            "{engine}"
        );
        assert_eq!(monitor["spec"]["endpoints"][0]["port"].as_str(), Some("http"));
        let (compose, _) = render_ok(&["--recipe", file.to_str().expect("utf-8"), "--target", "compose"]);
        let hash = kind::<ConfigMap>(&docs, "ConfigMap").metadata.name.expect("name");
        let hash = hash.rsplit('-').next().expect("hash");
        assert!(
            compose.contains(&format!("sous.dev/recipe-hash: \"{hash}\""))
                || compose.contains(&format!("sous.dev/recipe-hash: {hash}")),
            "{compose}"
        );
    }
}

/// What a container runs, by Docker's and compose's rule: `entrypoint` replaces the
/// image's `ENTRYPOINT` and drops its `CMD` (compose-spec `spec.md`, `entrypoint`; Docker's
/// `--entrypoint`); `command` replaces the `CMD` only.
fn compose_effective(
    image: &ImageDefaults,
    entrypoint: Option<Vec<String>>,
    command: Option<Vec<String>>,
) -> Vec<String> {
    let strings = |s: &[&str]| s.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    match entrypoint {
        Some(entrypoint) => [entrypoint, command.unwrap_or_default()].concat(),
        None => [
            strings(image.entrypoint),
            command.unwrap_or_else(|| strings(image.cmd)),
        ]
        .concat(),
    }
}

/// What a container runs, by Kubernetes' rule (the Container API's `command` and
/// `args`): `command` replaces the image's `ENTRYPOINT`, and without `args` the image's
/// `CMD` is not used either; `args` alone replaces the `CMD`.
fn k8s_effective(
    image: &ImageDefaults,
    command: Option<Vec<String>>,
    args: Option<Vec<String>>,
) -> Vec<String> {
    let strings = |s: &[&str]| s.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    match command {
        Some(command) => [command, args.unwrap_or_default()].concat(),
        None => [
            strings(image.entrypoint),
            args.unwrap_or_else(|| strings(image.cmd)),
        ]
        .concat(),
    }
}

fn strings_of(value: &Value) -> Option<Vec<String>> {
    value.as_sequence().map(|s| {
        s.iter()
            // compose writes a literal `$` as `$$`.
            .map(|v| v.as_str().expect("a string").replace("$$", "$"))
            .collect()
    })
}

/// Every target runs, in the engine's official image (and the init steps in the sous
/// image), exactly the command line `sous serve --dry-run` prints for the seed recipes:
/// the images' own ENTRYPOINT (`vllm serve`, `sous`) cannot end up in front of it, as it
/// did under compose, where `command` only replaces the image's CMD.
#[test]
fn every_target_runs_the_dry_run_command_line_in_the_image() {
    const BASELINE: &str = "recipes/dgx-spark/qwen3.8-27b-nvfp4-baseline.toml";
    let cases: [(&str, &[&str], EngineKind, &[&str]); 5] = [
        (DGX, &[], EngineKind::Vllm, &["vllm", "serve"]),
        (BASELINE, &[], EngineKind::Vllm, &["vllm", "serve"]),
        (TITAN, &[], EngineKind::Vllm, &["vllm", "serve"]),
        // The other engines' official images, with the baseline's settings.
        (
            BASELINE,
            &[
                "--set",
                "engine.kind=sglang",
                "--set",
                "engine.image=lmsysorg/sglang:v0.5.23",
            ],
            EngineKind::Sglang,
            &["/opt/nvidia/nvidia_entrypoint.sh"],
        ),
        (
            BASELINE,
            &[
                "--set",
                "engine.kind=trtllm",
                "--set",
                "engine.version=1.3.0",
                "--set",
                "engine.image=nvcr.io/nvidia/tensorrt-llm/release:1.3.0",
            ],
            EngineKind::Trtllm,
            &["/opt/nvidia/nvidia_entrypoint.sh"],
        ),
    ];
    for (recipe, sets, engine_kind, image_entrypoint) in cases {
        let (code, dry, stderr) = run(sous()
            .args(["serve", "--dry-run", "--json", "--recipe", recipe])
            .args(sets));
        assert_eq!(code, 0, "{stderr}");
        let dry: serde_json::Value = serde_json::from_str(&dry).expect("json");
        let argv: Vec<String> = serde_json::from_value::<Vec<String>>(dry["argv"].clone())
            .expect("argv")
            .into_iter()
            // The engine's option files are mounted at /etc/sous in the containers.
            .map(|a| match a.rsplit_once('/') {
                Some((_, "trtllm-options.yaml")) => "/etc/sous/trtllm-options.yaml".to_owned(),
                _ => a,
            })
            .collect();
        let version = dry["version"].as_str().and_then(|v| v.parse().ok());

        let (stream, _) = render_ok(&[&["--recipe", recipe][..], sets].concat());
        let docs = documents(&stream);
        let d: Deployment = kind(&docs, "Deployment");
        let pod = pod_spec(&d);
        let engine = &pod.containers[0];
        let image_ref = engine.image.clone().expect("image");
        let image = image::official(&image_ref, engine_kind, version.as_ref())
            .unwrap_or_else(|| panic!("{image_ref} is an official {engine_kind:?} image"));
        assert_eq!(image.entrypoint, image_entrypoint, "{recipe}");
        assert_eq!(
            k8s_effective(&image, engine.command.clone(), engine.args.clone()),
            argv,
            "{recipe}: Kubernetes"
        );
        for init in pod.init_containers.clone().unwrap_or_default() {
            let effective = k8s_effective(&image::SOUS_IMAGE, init.command.clone(), init.args.clone());
            assert_eq!(effective[0], "/usr/local/bin/sous", "{recipe}: {effective:?}");
            assert!(
                ["pull", "quantize"].contains(&effective[1].as_str()),
                "{effective:?}"
            );
        }

        let (compose, _) = render_ok(&[&["--recipe", recipe, "--target", "compose"][..], sets].concat());
        let compose: Value = serde_yaml_ng::from_str(
            compose
                .split("# ==> recipe.toml <==")
                .next()
                .expect("compose part"),
        )
        .expect("compose parses");
        let mut engines = 0;
        for (name, svc) in compose["services"].as_mapping().expect("services") {
            let name = name.as_str().expect("name");
            let entrypoint = strings_of(&svc["entrypoint"]);
            let command = strings_of(&svc["command"]);
            assert!(entrypoint.is_some(), "{recipe}: {name} sets its entrypoint");
            if svc["image"].as_str() == Some(image_ref.as_str()) {
                engines += 1;
                let effective = compose_effective(&image, entrypoint, command.clone());
                // Every replica's engine keeps the recipe's port inside its container;
                // compose maps a host port of its own to it.
                assert_eq!(effective, argv, "{recipe}: compose service {name}");
                // What `command` alone did: the image's entrypoint in front of the argv.
                let before = compose_effective(&image, None, Some(argv.clone()));
                assert_ne!(before, argv, "the image's ENTRYPOINT makes `command` alone wrong");
            } else if name.ends_with("-router") {
                // docker/router.Dockerfile sets no ENTRYPOINT: the service's is the router.
                assert_eq!(
                    entrypoint,
                    Some(vec!["vllm-router".to_owned()]),
                    "{recipe}: {name}"
                );
                assert!(
                    command.is_some_and(|c| c.iter().any(|a| a == "--worker-urls")),
                    "{recipe}: {name}"
                );
            } else {
                let effective = compose_effective(&image::SOUS_IMAGE, entrypoint, command);
                assert_eq!(
                    effective[0], "/usr/local/bin/sous",
                    "{recipe}: {name}: {effective:?}"
                );
                assert_ne!(
                    effective[1], "/usr/local/bin/sous",
                    "{recipe}: {name}: {effective:?}"
                );
            }
        }
        assert!(engines >= 1, "{recipe}: an engine service");

        // systemd runs `sous serve` on the recipe it renders: the same command line.
        if recipe != TITAN {
            let out = tempfile::tempdir().expect("tempdir");
            let dir = out.path().join("units");
            let args = [
                &[
                    "render",
                    "--recipe",
                    recipe,
                    "--target",
                    "systemd",
                    "--out",
                    dir.to_str().expect("utf-8"),
                ][..],
                sets,
            ]
            .concat();
            let (code, _, stderr) = deploy(&args, &[]);
            assert_eq!(code, 0, "{stderr}");
            let rendered = std::fs::read_dir(&dir)
                .expect("units")
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "toml"))
                .expect("the recipe beside the units");
            let (code, dry_rendered, stderr) = run(sous().args([
                "serve",
                "--dry-run",
                "--json",
                "--recipe",
                rendered.to_str().expect("utf-8"),
            ]));
            assert_eq!(code, 0, "{stderr}");
            let dry_rendered: serde_json::Value = serde_json::from_str(&dry_rendered).expect("json");
            assert_eq!(dry_rendered["argv"], dry["argv"], "{recipe}: systemd");
        }
    }
}

/// The native engine's container is the sous image: its ENTRYPOINT (`sous`) is not run
/// twice either.
#[test]
fn the_native_engine_runs_sous_once_in_its_image() {
    let (compose, _) = render_ok(&[
        "--recipe",
        "recipes/local/smollm2-135m-nvfp4.toml",
        "--target",
        "compose",
    ]);
    let part = compose
        .split("# ==> ")
        .find(|p| p.starts_with("docker-compose.yml"))
        .expect("compose part");
    let compose: Value = serde_yaml_ng::from_str(part.split_once('\n').map_or(part, |(_, rest)| rest))
        .expect("compose parses");
    for (name, svc) in compose["services"].as_mapping().expect("services") {
        let effective = compose_effective(
            &image::SOUS_IMAGE,
            strings_of(&svc["entrypoint"]),
            strings_of(&svc["command"]),
        );
        assert_eq!(effective[0], "/usr/local/bin/sous", "{name:?}: {effective:?}");
        assert!(
            ["serve", "pull", "quantize"].contains(&effective[1].as_str()),
            "{name:?}: {effective:?}"
        );
    }
}
