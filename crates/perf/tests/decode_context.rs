//! What the engine's decode context counts (`decode_context`): Dynamo's provider reads it as past
//! KV and adds the token being fed; aisimulate 0.13's engine stack (`predict -c`) hands over
//! sequence lengths that already count it. One token of KV is ~24 ns of a Qwen3-30B-A3B DEP8
//! step, enough to move a request past a decode step boundary in a replay.

use serde_json::{json, Value};
use servesim_perf::{build_timer, AisConfig, DecodeContext};

fn config(decode_context: Option<&str>) -> Value {
    let mut c = json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 1,
        "attention_dp": 8, "moe_tp_size": 1, "moe_ep_size": 8, "worker_type": "decode"});
    if let Some(d) = decode_context {
        c["decode_context"] = json!(d);
    }
    c
}

#[test]
fn the_decode_context_is_checked_by_key() {
    let e = AisConfig::from_json("timing", &config(Some("current"))).unwrap_err();
    assert_eq!(e.message, r#"timing.decode_context: "current"; expected "past" or "sequence""#);
    assert_eq!(AisConfig::from_json("timing", &config(None)).unwrap().decode_context, DecodeContext::Past);
    assert_eq!(
        AisConfig::from_json("timing", &config(Some("sequence"))).unwrap().decode_context,
        DecodeContext::Sequence
    );
}

/// One request of 3000 prompt tokens and one output token on its second decode step: the
/// reference's engine stack times it at 3000 tokens of past KV (its `static_phase_diagnostics`
/// generation ops at context_length 3000 sum to 7.012699029220111 ms, `scripts/ais_ops.py`;
/// its replay reports a TTST of 7.012699 ms on this shape), Dynamo's provider one token later.
#[test]
fn a_sequence_context_reads_one_token_less_than_a_past_one() {
    let build = |d| build_timer("timing", "ais", &config(d));
    let (sequence, past) = match (build(Some("sequence")), build(None)) {
        (Ok(s), Ok(p)) => (s, p),
        (Err(e), _) | (_, Err(e)) if e.to_string().contains("no AIS performance data found") => {
            eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
            return;
        }
        (Err(e), _) | (_, Err(e)) => panic!("{e}"),
    };
    let seq = sequence.decode_ms(1, 3001, 1 << 20).unwrap();
    assert!((seq - 7.012699029220111).abs() <= 1e-12, "{seq}");
    // Past KV 3001 plus the token being fed: the step one token later.
    let later = past.decode_ms(1, 3001, 1 << 20).unwrap();
    assert_eq!(later, sequence.decode_ms(1, 3002, 1 << 20).unwrap());
    assert!(later > seq + 2e-5, "{later} vs {seq}");
    // A batch reads its mean; an empty context still feeds one token.
    assert_eq!(
        sequence.decode_ms(4, 4 * 3001 + 3, 1 << 20).unwrap(),
        sequence.decode_ms(4, 4 * 3001, 1 << 20).unwrap()
    );
    assert_eq!(sequence.decode_ms(1, 0, 1 << 20).unwrap(), sequence.decode_ms(1, 1, 1 << 20).unwrap());
}
