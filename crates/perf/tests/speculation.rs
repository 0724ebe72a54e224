//! An AIS timing config's `speculation` (Dynamo 1.6.1's `ForwardPassSpeculationConfig`): read and
//! checked as the reference reads and checks it, with its messages (probed through
//! `normalize_mocker_config` on Dynamo 1.6.1 + aisimulate 0.13.0).

use serde_json::{json, Value};
use servesim_perf::AisConfig;

fn read(speculation: Value, extra: Value) -> Result<AisConfig, String> {
    let mut config = json!({"model": "m", "system": "s", "backend": "vllm", "worker_type": "aggregated",
                            "speculation": speculation});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    AisConfig::from_json("engine.timing_model.config", &config).map_err(|e| e.message)
}

#[test]
fn malformed_schemes_get_serdes_messages() {
    let ngram = |params: Value| json!({"kind": "ngram", "params": params});
    let cases = [
        (json!({"kind": "mtp", "params": {"num_speculative_tokens": 2}}), "unknown variant `mtp`, expected `ngram`"),
        (
            json!({"kind": "eagle3", "params": {"num_speculative_tokens": 2}}),
            "unknown variant `eagle3`, expected `ngram`",
        ),
        (json!({"kind": "draft_model", "params": {}}), "unknown variant `draft_model`, expected `ngram`"),
        (
            ngram(json!({"num_speculative_tokens": 2, "trigger_rate": 0.5})),
            "unknown field `trigger_rate`, expected `num_speculative_tokens`",
        ),
        (
            json!("ngram"),
            "invalid type: string \"ngram\", expected adjacently tagged enum ForwardPassSpeculationConfig",
        ),
        (json!([]), "invalid length 0, expected adjacently tagged enum ForwardPassSpeculationConfig"),
        (json!({"params": {"num_speculative_tokens": 2}}), "missing field `kind`"),
        (json!({"kind": "ngram"}), "missing field `params`"),
        (ngram(json!({})), "missing field `num_speculative_tokens`"),
        (ngram(json!({"num_speculative_tokens": "2"})), "invalid type: string \"2\", expected u32"),
        (ngram(json!({"num_speculative_tokens": -1})), "invalid value: integer `-1`, expected u32"),
        (ngram(json!({"num_speculative_tokens": 2.0})), "invalid type: floating point `2.0`, expected u32"),
        (ngram(json!(3)), "invalid type: integer `3`, expected struct variant ForwardPassSpeculationConfig::Ngram"),
        (json!({"kind": 5, "params": {}}), "invalid type: integer `5`, expected string or map"),
        (
            json!({"kind": "ngram", "params": {"num_speculative_tokens": 2}, "x": 1}),
            "invalid value: string \"x\", expected \"kind\" or \"params\"",
        ),
    ];
    for (spec, want) in cases {
        let got = read(spec.clone(), json!({})).unwrap_err();
        assert_eq!(
            got,
            format!("engine.timing_model.config.speculation: invalid AIS performance config: {want}"),
            "{spec}"
        );
    }
}

#[test]
fn ngram_is_checked_then_read() {
    let ngram = |n: i64| json!({"kind": "ngram", "params": {"num_speculative_tokens": n}});
    let invalid = |why: &str| {
        format!("engine.timing_model.config.speculation: invalid engine config: invalid forward pass perf model config: {why}")
    };
    assert_eq!(
        read(ngram(2), json!({"nextn": 2})).unwrap_err(),
        invalid("ngram speculation cannot be combined with nextn")
    );
    assert_eq!(
        read(ngram(2), json!({"backend": "sglang"})).unwrap_err(),
        invalid("ngram speculation requires backend=vllm")
    );
    for n in [0, 6] {
        assert_eq!(read(ngram(n), json!({})).unwrap_err(), invalid("ngram num_speculative_tokens must be in 1..=5"));
    }
    // A valid scheme times its verify pass (whether a launch schedules the drafts is the
    // engine's to decide: Dynamo's refuses them, aisimulate's replay roles schedule them).
    assert_eq!(read(ngram(2), json!({})).unwrap().ngram, 2);
    assert_eq!(read(Value::Null, json!({})).unwrap().ngram, 0);
}

/// The EAGLE-3 draft of `tests/deploy/predict_spec_eagle3_*.yaml` (Qwen3-32B's widths).
fn eagle3(tokens: u32) -> Value {
    json!({"kind": "eagle3", "params": {"num_speculative_tokens": tokens},
           "draft_config": {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 5120,
                            "intermediate_size": 25600, "num_attention_heads": 64, "num_key_value_heads": 8,
                            "head_dim": 128, "vocab_size": 151936, "draft_vocab_size": 32000}})
}

/// servesim's EAGLE-3 extension (a `draft_config` beside the kind) is read with the reference's
/// conditions; without a draft config the kind is Dynamo's unknown variant.
#[test]
fn eagle3_is_read_with_the_references_conditions() {
    let cfg = read(eagle3(3), json!({})).unwrap();
    assert_eq!((cfg.ngram, cfg.eagle3.as_ref().map(|g| (g.head_dim, g.vocab))), (3, Some((128, 32000))));
    let at = "engine.timing_model.config.speculation";
    let cases = [
        (eagle3(3), json!({"nextn": 1}), format!("{at}: eagle3 speculation cannot be combined with nextn")),
        (eagle3(3), json!({"backend": "trtllm"}), format!("{at}: eagle3 speculation requires backend=sglang or vllm")),
        (
            eagle3(6),
            json!({}),
            format!("{at}.params.num_speculative_tokens: speculative replay requires 1..5 draft tokens, got 6"),
        ),
        (
            json!({"kind": "eagle3", "params": {"tree_shape": [2, 1]}, "draft_config": {}}),
            json!({}),
            format!("{at}.params: speculative replay requires an EAGLE chain with one verification token per draft"),
        ),
        (
            json!({"kind": "eagle3", "draft_config": {"hidden_size": 8}}),
            json!({}),
            format!(
                "{at}.draft_config: the draft config lacks required keys: num_hidden_layers, intermediate_size, \
                 num_attention_heads"
            ),
        ),
    ];
    for (spec, extra, want) in cases {
        assert_eq!(read(spec.clone(), extra).unwrap_err(), want, "{spec}");
    }
}

/// A mixed pass with an EAGLE-3 draft: the draft's prefill joins the context attention at the
/// prefill shape and its decode graph the decode attention at the verify batch (which its
/// TokenScale maps to one token per request), never the shared token pass — so the pass is the
/// draftless verify pass plus exactly the draft ops of a prefill step and a decode step. Runs
/// when the AIS data is installed.
#[test]
fn a_mixed_pass_times_the_draft_with_its_phases_attention() {
    let build = |spec: Value| {
        let cfg = json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm",
                         "worker_type": "aggregated", "tp": 2, "speculation": spec});
        servesim_perf::estimator(&AisConfig::from_json("config", &cfg).unwrap())
    };
    let Ok(drafted) = build(eagle3(3)) else {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    };
    let plain = build(json!({"kind": "ngram", "params": {"num_speculative_tokens": 3}})).unwrap();
    let r = servesim_perf::RankMetrics {
        num_prefill_requests: 1,
        sum_prefill_tokens: 700,
        sum_prefill_kv_tokens: 300,
        num_decode_requests: 12,
        sum_decode_kv_tokens: 12 * 900,
    };
    let draft_sum =
        |ops: Vec<(String, f64)>| ops.iter().filter(|(n, _)| n.starts_with("draft_")).map(|(_, v)| v).sum::<f64>();
    let ctx = draft_sum(drafted.prefill_ops(1, 1000, 300).unwrap());
    let gen = draft_sum(drafted.decode_ops(12, 900).unwrap());
    assert!(ctx > 0.0 && gen > 0.0);
    let (with, without) = (drafted.rank_latency_ms(&r).unwrap(), plain.rank_latency_ms(&r).unwrap());
    assert!(((with - without) - (ctx + gen)).abs() < 1e-9 * with, "{with} - {without} vs {ctx} + {gen}");
    // The decode draft runs at one token per request: 1 fc + 3 layer passes at 12 tokens, not 48.
    let fc = drafted.decode_ops(12, 900).unwrap().into_iter().find(|(n, _)| n == "draft_eagle3_fc").unwrap().1;
    let fc_prefill =
        drafted.prefill_ops(1, 12, 0).unwrap().into_iter().find(|(n, _)| n == "draft_eagle3_fc").unwrap().1;
    assert_eq!(fc, fc_prefill, "the fc GEMM at 12 tokens in both phases");
}

/// servesim's standalone-draft extension (`kind: draft_model` with a `draft_model_path`) is read
/// with the reference's conditions and messages; without the path the kind is Dynamo's unknown
/// variant (`malformed_schemes_get_serdes_messages`).
#[test]
fn draft_model_is_read_with_the_references_conditions() {
    let dm = |params: Value| json!({"kind": "draft_model", "draft_model_path": "Qwen/Qwen3-0.6B", "params": params});
    let cfg = read(dm(json!({"num_speculative_tokens": 3, "draft_tp_size": 2})), json!({})).unwrap();
    let draft = cfg.draft_model.as_ref().unwrap();
    assert_eq!((cfg.ngram, draft.path.as_str(), draft.tokens, draft.tp), (3, "Qwen/Qwen3-0.6B", 3, Some(2)));
    let at = "engine.timing_model.config.speculation";
    let cases = [
        (
            dm(json!({"num_speculative_tokens": 2})),
            json!({"nextn": 1}),
            format!("{at}: draft_model speculation cannot be combined with nextn"),
        ),
        (
            dm(json!({"num_speculative_tokens": 2})),
            json!({"backend": "sglang"}),
            format!("{at}: draft_model modeling supports backends ('vllm',), got \"sglang\""),
        ),
        (
            dm(json!({})),
            json!({}),
            format!(
                "{at}.params.num_speculative_tokens: draft_model requires params['num_speculative_tokens'] (the \
                 deployment K; there is no checkpoint default)"
            ),
        ),
        (
            dm(json!({"num_speculative_tokens": 2, "depth": 1})),
            json!({}),
            format!("{at}.params.depth: unknown key; expected num_speculative_tokens or draft_tp_size"),
        ),
        (
            json!({"kind": "draft_model", "draft_model_path": null, "params": {"num_speculative_tokens": 2}}),
            json!({}),
            format!("{at}.draft_model_path: draft_model requires draft_model_path (the standalone draft checkpoint)"),
        ),
    ];
    for (spec, extra, want) in cases {
        assert_eq!(read(spec.clone(), extra).unwrap_err(), want, "{spec}");
    }
}

/// A standalone draft adds its whole generation graph once per draft token (every op named
/// `draft_…`, at one token per request) and its whole context graph once: its decode ops are
/// `n` copies of the draft model's own decode ops at the request batch, its prefill ops the
/// draft model's prefill ops. Runs when the AIS data is installed.
#[test]
fn a_draft_model_adds_its_own_graphs() {
    let build = |model: &str, spec: Option<Value>| {
        let mut cfg = json!({"model": model, "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated"});
        if let Some(spec) = spec {
            cfg["speculation"] = spec;
        }
        servesim_perf::estimator(&AisConfig::from_json("config", &cfg).unwrap())
    };
    let spec = json!({"kind": "draft_model", "draft_model_path": "Qwen/Qwen3-0.6B",
                      "params": {"num_speculative_tokens": 3}});
    let Ok(drafted) = build("Qwen/Qwen3-8B", Some(spec)) else {
        eprintln!("NOTICE: AIS data not installed; skipping");
        return;
    };
    let draft = build("Qwen/Qwen3-0.6B", None).unwrap();
    let sum = |ops: Vec<(String, f64)>, drafts: bool| {
        ops.iter().filter(|(n, _)| n.starts_with("draft_") == drafts).map(|(_, v)| v).sum::<f64>()
    };
    let (ours, alone) =
        (sum(drafted.decode_ops(12, 900).unwrap(), true), sum(draft.decode_ops(12, 900).unwrap(), false));
    assert!(alone > 0.0 && (ours - 3.0 * alone).abs() < 1e-9 * ours, "{ours} vs 3 × {alone}");
    let (ours, alone) =
        (sum(drafted.prefill_ops(2, 1000, 0).unwrap(), true), sum(draft.prefill_ops(2, 1000, 0).unwrap(), false));
    assert!(alone > 0.0 && (ours - alone).abs() < 1e-9 * ours, "{ours} vs {alone}");
    let names: Vec<String> = drafted.decode_ops(12, 900).unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"draft_generation_attention".to_string()), "{names:?}");
}
