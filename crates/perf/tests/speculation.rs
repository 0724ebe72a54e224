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
