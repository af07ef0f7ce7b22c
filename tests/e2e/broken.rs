//! The broken-recipe corpus: every file fails `sous recipe check` with exit code 1 and
//! its own message. The whole stderr of each is pinned by a snapshot; the table below
//! states what each message must say, so a snapshot update cannot quietly lose it.

use crate::util::{run, sous};

/// File → phrases its error must contain.
const EXPECTED: &[(&str, &[&str])] = &[
    (
        "vllm-cpu-kv-space-fraction.toml",
        &[
            "`env.VLLM_CPU_KVCACHE_SPACE`",
            "`1.5` is not a whole number of GiB",
            "hint: give the KV budget as `memory.kv_cache_bytes`",
        ],
    ),
    (
        "vllm-cpu-kv-space-conflict.toml",
        &[
            "`env.VLLM_CPU_KVCACHE_SPACE`",
            "2GiB",
            "4GiB",
            "takes the variable",
        ],
    ),
    (
        "extra-args-memory.toml",
        &[
            "`engine.extra_args`",
            "`--kv-cache-memory` sets what `memory.kv_cache_bytes` sets",
            "hint: set `memory.kv_cache_bytes` in the recipe",
        ],
    ),
    (
        "trtllm-options-memory.toml",
        &[
            "`engine.extra_options`",
            "`kv_cache_config.free_gpu_memory_fraction` is what `memory.gpu_utilization` sets",
        ],
    ),
    (
        "deploy-bad-name.toml",
        &[
            "invalid `deploy.name`",
            "is not a DNS-1123 label",
            "deploy-bad-name.toml:9:8",
        ],
    ),
    (
        "deploy-request-above-limit.toml",
        &[
            "the request (120Gi) is above the limit (64Gi)",
            "deploy-request-above-limit.toml:10:18",
        ],
    ),
    (
        "deploy-bad-quantity.toml",
        &["`120GB` is not a Kubernetes quantity", "hint: write e.g. `120Gi`"],
    ),
    (
        "deploy-typo.toml",
        &["unknown key `sise` in `[deploy.storage]`", "did you mean `size`?"],
    ),
    (
        "unknown-key.toml",
        &[
            "unknown key `colour` in the top level",
            "unknown-key.toml:2:1",
            "hint: valid keys here",
        ],
    ),
    (
        "typo-key.toml",
        &[
            "unknown key `max_model_lenn` in `[serving]`",
            "typo-key.toml:8:1",
            "did you mean `max_model_len`?",
        ],
    ),
    (
        "engine-flag-key.toml",
        &[
            "unknown key `enable_prefix_caching`",
            "`enable_prefix_caching` is `serving.prefix_caching`",
        ],
    ),
    (
        "wrong-table.toml",
        &[
            "unknown key `kv_cache_dtype` in `[serving]`",
            "belongs in `[memory]`",
        ],
    ),
    (
        "wrong-type.toml",
        &[
            "invalid `serving.max_num_seqs`",
            "expected a whole number, found string",
            "wrong-type.toml:8:16",
        ],
    ),
    (
        "out-of-range.toml",
        &[
            "invalid `memory.gpu_utilization`: 1.5 is outside (0, 1]",
            "out-of-range.toml:8:19",
        ],
    ),
    (
        "conflicting-memory.toml",
        &[
            "conflicting settings",
            "`memory.kv_cache_bytes` fixes the KV budget",
            "conflicting-memory.toml:11:16",
        ],
    ),
    (
        "fallback-not-lower.toml",
        &["0.9 is not below `memory.gpu_utilization` (0.85)"],
    ),
    (
        "host-floor-zero.toml",
        &["invalid `memory.host_floor`: a floor of 0 bytes is never crossed"],
    ),
    (
        "unsupported-speculative.toml",
        &[
            "vLLM 0.27.1 has no speculative method `medusa`",
            "known: `mtp`, `ngram`",
            "more",
        ],
    ),
    (
        "speculative-too-old.toml",
        &[
            "vLLM 0.10.2 cannot honour `serving.speculative.method`",
            "from vLLM 0.11.0 on",
        ],
    ),
    (
        "speculative-trtllm.toml",
        &[
            "TensorRT-LLM 1.3.0 has no speculative method `suffix`",
            "known: `mtp`",
        ],
    ),
    (
        "kv-dtype-too-old.toml",
        &["vLLM 0.10.2 has no KV-cache dtype `bfloat16`"],
    ),
    (
        "cycle-a.toml",
        &[
            "`extends` forms a cycle",
            "cycle-a.toml -> tests/recipes/broken/cycle-b.toml -> tests/recipes/broken/cycle-a.toml",
        ],
    ),
    (
        "missing-parent.toml",
        &[
            "cannot read recipe `tests/recipes/broken/no-such-parent.toml`",
            "missing-parent.toml:1:11",
            "relative to the file that names them",
        ],
    ),
    (
        "bad-engine-kind.toml",
        &["`engine.kind` cannot be `vlm`", "did you mean `vllm`?"],
    ),
    (
        "ambiguous-size.toml",
        &["ambiguous unit `G` in `14.5G`", "ambiguous-size.toml:8:18"],
    ),
    (
        "trtllm-api-key.toml",
        &[
            "TensorRT-LLM 1.3.0 cannot honour `server.api_key_env`",
            "authenticating proxy",
        ],
    ),
    (
        "sglang-kv-bytes.toml",
        &[
            "SGLang 0.5.23 cannot honour `memory.kv_cache_bytes`",
            "--max-total-tokens",
        ],
    ),
    (
        "no-engine.toml",
        &["missing `engine.kind`", "set `engine.kind` to `vllm`"],
    ),
    (
        "no-model.toml",
        &["missing `model.repo`: the recipe names no model"],
    ),
    ("syntax-error.toml", &["invalid TOML", "syntax-error.toml:2:"]),
    (
        "auto-tool-no-parser.toml",
        &["`serving.auto_tool_choice` needs a `serving.tool_call_parser`"],
    ),
    (
        "batched-below-len.toml",
        &["`serving.max_batched_tokens` (8192) must be at least `serving.max_model_len` (32768)"],
    ),
    (
        "unknown-parser.toml",
        &[
            "vLLM 0.33.0 has no reasoning parser `qwen4`",
            "did you mean `qwen3`?",
        ],
    ),
    (
        "api-key-literal.toml",
        &[
            "`sk-live-1234` is not an environment variable name",
            "not the key itself",
        ],
    ),
];

#[test]
fn every_broken_recipe_fails_with_its_message_and_exit_code_1() {
    insta::glob!(
        crate::util::root().join("tests/recipes/broken"),
        "*.toml",
        |path| {
            let file = path.file_name().and_then(|f| f.to_str()).expect("utf-8 name");
            let relative = format!("tests/recipes/broken/{file}");
            let (code, stdout, stderr) = run(sous().args(["recipe", "check", &relative]));
            assert_eq!(code, 1, "{file}: exit code\n{stderr}");
            assert!(stdout.is_empty(), "{file}: nothing on stdout, got {stdout}");
            // cycle-b.toml is part of cycle-a's chain; both must be refused.
            let expected = EXPECTED
                .iter()
                .find(|(name, _)| *name == file)
                .map(|(_, phrases)| *phrases)
                .or_else(|| (file == "cycle-b.toml").then_some(&["`extends` forms a cycle"][..]))
                .unwrap_or_else(|| panic!("{file} has no entry in EXPECTED"));
            for phrase in expected {
                assert!(
                    stderr.contains(phrase),
                    "{file}: expected `{phrase}` in:\n{stderr}"
                );
            }
            insta::assert_snapshot!(stderr);
        }
    );
}

#[test]
fn a_missing_recipe_file_is_a_user_error() {
    let (code, _, stderr) = run(sous().args(["recipe", "check", "tests/recipes/nowhere.toml"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cannot read recipe `tests/recipes/nowhere.toml`: No such file"),
        "{stderr}"
    );
}

#[test]
fn bad_overrides_name_their_origin() {
    let recipe = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
    let (code, _, stderr) = run(sous().args(["recipe", "check", recipe, "--set", "serving.max_num_seq=8"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("unknown key `max_num_seq` in `[serving]`"),
        "{stderr}"
    );
    assert!(stderr.contains("--> --set serving.max_num_seq=8"), "{stderr}");
    assert!(stderr.contains("did you mean `max_num_seqs`?"), "{stderr}");

    let (code, _, stderr) = run(sous()
        .args(["recipe", "check", recipe])
        .env("SOUS_MEMORY__GPU_UTILIZATION", "2"));
    assert_eq!(code, 1);
    assert!(stderr.contains("2 is outside (0, 1]"), "{stderr}");
    assert!(
        stderr.contains("--> environment variable SOUS_MEMORY__GPU_UTILIZATION"),
        "{stderr}"
    );

    let (code, _, stderr) = run(sous().args(["recipe", "check", recipe, "--set", "no-equals-sign"]));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("invalid override `no-equals-sign`: expected `key.path=value`"),
        "{stderr}"
    );
}
