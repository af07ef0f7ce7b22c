//! The tune's reasoning, case by case: levers, the first pass, verdicts, the tuned
//! recipe's text.

use std::collections::BTreeMap;

use super::recipe::toml_value;
use super::*;

#[test]
fn evidence_names_what_moved_and_what_only_the_trial_has() {
    let figures = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    };
    let base = figures(&[("prefix_cache_hit_rate", 0.0), ("kv_cache_usage_max", 0.16)]);
    let trial = figures(&[
        ("prefix_cache_hit_rate", 0.5),
        ("kv_cache_usage_max", 0.16),
        ("spec_decode_acceptance_rate", 0.44),
    ]);
    assert_eq!(
        evidence(&base, &trial).as_deref(),
        Some("prefix-cache hit rate 0 % -> 50 %, draft acceptance 44 %")
    );
    assert_eq!(evidence(&base, &base), None);
}

fn sample(trial: &str, run: usize, value: f64) -> Sample {
    Sample {
        trial: trial.into(),
        run,
        outcome: Outcome::Ok,
        value: Some(value),
        message: None,
        figures: BTreeMap::new(),
    }
}

#[test]
fn levers_parse_values_lists_and_speculation() {
    let l = Lever::parse("memory.oom_fallback=[0.85, 0.8],[0.8]").expect("lever");
    assert_eq!(l.values.len(), 2);
    assert_eq!(l.values[0][0].value, "[0.85, 0.8]");
    let s = Lever::parse("serving.speculative=ngram:3,mtp:2").expect("spec");
    assert_eq!(s.values[1][0].arg(), "serving.speculative.method=\"mtp\"");
    assert_eq!(s.values[1][1].arg(), "serving.speculative.tokens=2");
    assert!(matches!(
        Lever::parse("serving.speculative=ngram"),
        Err(LeverError::Speculative(_))
    ));
    assert!(matches!(
        Lever::parse("max_num_seqs"),
        Err(LeverError::Malformed(_))
    ));
    assert!(matches!(Lever::parse("a=1,,2"), Err(LeverError::Malformed(_))));
}

#[test]
fn the_first_pass_skips_what_the_baseline_already_sets() {
    let levers = vec![
        Lever::parse("serving.prefix_caching=true,false").expect("lever"),
        Lever::parse("memory.kv_cache_bytes=\"1GiB\"").expect("lever"),
    ];
    let current = |key: &str| match key {
        "serving.prefix_caching" => Some("false".to_owned()),
        "memory.kv_cache_bytes" => Some("\"1GiB\"".to_owned()),
        _ => None,
    };
    let ids: Vec<String> = first_pass(&levers, current).into_iter().map(|t| t.id).collect();
    assert_eq!(ids, ["baseline", "serving.prefix_caching=true"]);
}

#[test]
fn the_native_engine_s_default_levers_move_the_arithmetic_and_cache_to_the_other_dtype() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/local/smollm2-135m.toml");
    let recipe = sous_engine::recipe::load(&path, &sous_engine::recipe::Overrides::new())
        .expect("the shipped recipe loads")
        .recipe;
    let offered = |recipe: &Recipe, key: &str| -> Vec<Vec<Setting>> {
        default_levers(recipe, Default::default())
            .into_iter()
            .find(|l| l.key == key)
            .unwrap_or_else(|| panic!("no {key} lever"))
            .values
    };
    let setting = |key: &str, value: &str| {
        vec![vec![Setting {
            key: key.into(),
            value: value.into(),
        }]]
    };
    // The shipped recipe computes and caches in bf16: f32 is what is tried (the
    // cache follows the served dtype).
    assert_eq!(
        offered(&recipe, "serving.dtype"),
        setting("serving.dtype", "\"float32\"")
    );
    assert!(
        !default_levers(&recipe, Default::default())
            .iter()
            .any(|l| l.key == "memory.kv_cache_dtype")
    );
    // A recipe in f32 is offered bf16 arithmetic and a bf16 cache.
    let mut f32 = recipe.clone();
    f32.serving.dtype = Some(ModelDtype::Float32);
    assert_eq!(
        offered(&f32, "serving.dtype"),
        setting("serving.dtype", "\"bfloat16\"")
    );
    assert_eq!(
        offered(&f32, "memory.kv_cache_dtype"),
        setting("memory.kv_cache_dtype", "\"bfloat16\"")
    );
    // Neither is offered for a GPU engine's recipe (vLLM computes in the model's dtype).
    let mut vllm = recipe.clone();
    vllm.engine.kind = EngineKind::Vllm;
    assert!(
        !default_levers(&vllm, Default::default())
            .iter()
            .any(|l| l.key == "serving.dtype")
    );
}

#[test]
fn only_a_lever_whose_interval_clears_the_baseline_helped() {
    let levers = vec![
        Lever::parse("a=1,2,3").expect("lever"),
        Lever::parse("b=1").expect("lever"),
        Lever::parse("c=1").expect("lever"),
    ];
    let trials = first_pass(&levers, |_| None);
    let mut samples = Vec::new();
    for (i, v) in [100.0, 102.0, 98.0].iter().enumerate() {
        samples.push(sample("baseline", i, *v));
        samples.push(sample("a=1", i, v + 1.0)); // noise
        samples.push(sample("a=2", i, v * 1.5)); // a clear gain
        samples.push(sample("b=1", i, v * 0.5)); // a loss
    }
    // A breach of the SLO is never chosen, however fast.
    for run in 0..3 {
        samples.push(Sample {
            outcome: Outcome::SloBreach,
            value: Some(1000.0),
            message: Some("p99 TTFT 900 ms > 500 ms".into()),
            ..sample("a=3", run, 0.0)
        });
    }
    samples.push(Sample {
        outcome: Outcome::Oom,
        value: None,
        message: Some("CUDA out of memory".into()),
        ..sample("c=1", 0, 0.0)
    });
    let results: Vec<TrialResult> = trials.iter().map(|t| result(t, &samples)).collect();
    let verdict = judge(&results[0], &levers, &results, Objective::OutputThroughput);
    let helped: Vec<&str> = verdict.helped.iter().map(|r| r.trial.id.as_str()).collect();
    assert_eq!(helped, ["a=2"]);
    assert_eq!(verdict.not_helped.len(), 2);
    assert!(
        verdict.not_helped[1].1.contains("failed"),
        "{:?}",
        verdict.not_helped
    );
    // For a lower-is-better objective the same numbers read the other way.
    let verdict = judge(&results[0], &levers, &results, Objective::Tpot);
    let helped: Vec<&str> = verdict.helped.iter().map(|r| r.trial.id.as_str()).collect();
    assert_eq!(helped, ["b=1"]);
}

#[test]
fn the_interval_uses_student_t() {
    let e = Estimate::of(&[1.0, 2.0, 3.0]).expect("estimate");
    // sd 1, n 3: 4.303 / sqrt(3)
    assert!((e.high - e.mean - 4.303 / 3f64.sqrt()).abs() < 1e-9);
    assert!(Estimate::of(&[5.0]).is_some_and(|e| e.low.is_infinite()));
}

#[test]
fn the_tuned_recipe_extends_the_baseline_and_says_what_each_value_gained() {
    let mut base = result(
        &Trial::baseline(),
        &[sample("baseline", 0, 100.0), sample("baseline", 1, 110.0)],
    );
    base.figures.insert("prefix_cache_hit_rate".into(), 0.0);
    let trial = Trial::new(
        Phase::Lever,
        Some("serving.prefix_caching".into()),
        vec![Setting {
            key: "serving.prefix_caching".into(),
            value: "true".into(),
        }],
    );
    let mut best = result(
        &trial,
        &[sample(&trial.id, 0, 200.0), sample(&trial.id, 1, 210.0)],
    );
    best.figures.insert("prefix_cache_hit_rate".into(), 0.62);
    let text = tuned_recipe(&TunedRecipe {
        extends: "base.toml",
        name: "base-tuned",
        baseline: &base,
        chosen: &best,
        helped: std::slice::from_ref(&best),
        objective: Objective::OutputThroughput,
        workload: "the agent workload",
        fallback: None,
    });
    assert!(
        text.contains("extends = \"base.toml\"\nname = \"base-tuned\"\n"),
        "{text}"
    );
    assert!(
        text.contains("[serving]\n# +95 % alone: 105.0 -> 205.0 tok/s; prefix-cache hit rate 0 % -> 62 %\nprefix_caching = true\n"),
        "{text}"
    );
    let parsed: toml::Value = text.parse().expect("TOML");
    assert_eq!(parsed["serving"]["prefix_caching"].as_bool(), Some(true));
}

#[test]
fn values_keep_their_toml_type() {
    assert_eq!(toml_value("4"), "4");
    assert_eq!(toml_value("\"1GiB\""), "\"1GiB\"");
    assert_eq!(toml_value("ngram"), "\"ngram\"");
    assert_eq!(toml_value("[0.85, 0.8]"), "[0.85, 0.8]");
    assert!(same_value("8", "8") && same_value("\"1GiB\"", "1GiB") && same_value("1", "1.0"));
    assert!(!same_value("true", "false"));
}

#[test]
fn extends_is_relative_where_it_can_be() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("recipes/base.toml");
    std::fs::create_dir_all(base.parent().expect("parent")).expect("mkdir");
    std::fs::write(&base, "").expect("write");
    std::fs::create_dir_all(dir.path().join("out")).expect("mkdir");
    assert_eq!(relative_extends(&base, &dir.path().join("recipes")), "base.toml");
    assert_eq!(
        relative_extends(&base, &dir.path().join("out")),
        "../recipes/base.toml"
    );
}

#[test]
fn a_hybrid_with_an_mtp_head_is_tuned_with_its_head_and_without_prefix_caching() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/local/smollm2-135m.toml");
    let recipe = sous_engine::recipe::load(&path, &sous_engine::recipe::Overrides::new())
        .expect("the shipped recipe loads")
        .recipe;
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/architectures/qwen3_next");
    let traits = ModelTraits::of(&fixture);
    assert_eq!(
        traits,
        ModelTraits {
            hybrid: true,
            mtp: true
        }
    );
    let levers = default_levers(&recipe, traits);
    assert!(!levers.iter().any(|l| l.key == "serving.prefix_caching"));
    let spec = levers
        .iter()
        .find(|l| l.key == "serving.speculative")
        .expect("a speculation lever");
    let methods: Vec<String> = spec.values.iter().map(|v| v[0].arg()).collect();
    assert_eq!(
        methods,
        [
            "serving.speculative.method=\"ngram\"",
            "serving.speculative.method=\"mtp\""
        ]
    );
    // A dense model without a head keeps both levers as they were.
    let plain = ModelTraits::of(&fixture.with_file_name("qwen3_moe"));
    assert_eq!(plain, ModelTraits::default());
}
