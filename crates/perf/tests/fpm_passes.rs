//! FPM interpolation of single passes against aisimulate 0.13, on a generated table whose decode
//! batches have gaps (capture rungs at 1, 4, 8) and whose prefill batch axis ends at 16.
//! Recorded with `$AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py` (which writes the
//! table with `scripts/fpm_table.py OUT --decode-batches 1,2,4,5,8,9,16 --decode-context
//! 256,4096,256` and queries the reference's `predict_prefill_latency_total` /
//! `predict_decode_latency_total`); every value within 1e-9 ms, every refusal word for word.

use std::path::PathBuf;
use std::process::Command;

use servesim_perf::fpm_interp::FpmTable;

/// `(batch, total new tokens, total KV read, ms)`: collected sites (exact and on-curve), then
/// batches above the collected ceiling 16, priced at the ceiling (a flat batch axis, no KV).
const PREFILL: [(u32, u32, u32, f64); 9] = [
    (1, 1024, 0, 60.539229),
    (4, 4096, 0, 230.156918),
    (3, 1002, 0, 59.233913171875),
    (16, 16384, 0, 908.627671),
    (7, 301, 0, 20.69771696875),
    (20, 4000, 0, 224.510182125),
    (32, 8192, 0, 455.676918),
    (40, 2600, 0, 147.40037759375),
    (64, 16384, 0, 908.627671),
];

/// `(batch, total past KV, ms)`: collected batches, then uncollected ones blended from their
/// bracket rows (2/4, 5/8, 9/16), then one bracket row alone where only it covers the KV.
const DECODE: [(u32, u32, f64); 14] = [
    (4, 4000, 7.220000000000001),
    (16, 16000, 10.28),
    (2, 2207, 6.75347),
    (9, 2700, 7.172000000000001),
    (3, 3000, 6.965),
    (3, 7501, 7.91021),
    (6, 5400, 7.604),
    (7, 14000, 9.455),
    (12, 12000, 9.26),
    (15, 45005, 16.37105),
    (12, 20000, 10.94),
    (3, 900, 6.479),
    (12, 40000, 15.32),
    (14, 3000, 7.235),
];

/// The table (None, with a notice, without the reference venv's pyarrow).
fn table() -> Option<FpmTable> {
    let venv = std::env::var("AISIM_REF_VENV").ok().filter(|v| !v.is_empty())?;
    let python = PathBuf::from(venv).join("bin/python");
    if !python.is_file() {
        eprintln!("NOTICE: {} missing; skipping the FPM per-pass goldens", python.display());
        return None;
    }
    let out = std::env::temp_dir().join(format!("servesim-fpm-passes-{}", std::process::id()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fpm_table.py");
    let run = Command::new(python)
        .arg(script)
        .arg(&out)
        .args(["--decode-batches", "1,2,4,5,8,9,16", "--decode-context", "256,4096,256"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let identity: Vec<String> = [
        "bfloat16", "bfloat16", "bfloat16", "half", "bfloat16", "1", "1", "1", "1", "1", "1", "auto", "auto", "False",
        "False", "", "full", "none", "text",
    ]
    .map(String::from)
    .to_vec();
    let path = out.join("fpm_forward_perf.parquet");
    Some(FpmTable::load(&path, &identity, "Qwen/Qwen3-8B", "h200_sxm", "vllm", "0.24.0").unwrap())
}

#[test]
fn single_passes_match_the_reference() {
    let Some(t) = table() else { return };
    for (batch, tokens, kv, want) in PREFILL {
        // servesim's query is per request: `batch` requests of `tokens / batch` new tokens.
        assert_eq!(tokens % batch, 0, "a uniform batch");
        let got = t.prefill_ms(batch, (tokens + kv) / batch, kv / batch).unwrap();
        assert!((got - want).abs() <= 1e-9, "prefill ({batch}, {tokens}, {kv}): {got} vs reference {want}");
    }
    for (batch, kv, want) in DECODE {
        let got = t.decode_total_ms(batch, kv).unwrap();
        assert!((got - want).abs() <= 1e-9, "decode ({batch}, {kv}): {got} vs reference {want}");
    }
}

#[test]
fn uncovered_bracket_rows_are_refused_as_the_reference_does() {
    let Some(t) = table() else { return };
    let err = t.decode_total_ms(12, 2000).unwrap_err();
    assert_eq!(
        err.message,
        "perf database error: FPM decode bracket rows 9/16 do not cover total_kv_read_tokens=2000                  \
         (curves span (2304, 36864) and (4096, 65536)); FPM never extrapolates."
    );
}
