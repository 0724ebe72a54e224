//! FPM interpolation of single passes against aisimulate 0.13, on a generated table whose decode
//! batches have gaps (capture rungs at 1, 4, 8), whose prefill batch axis ends at 16, and whose
//! prefill sites at KV 4096 and 16384 (batches 1, 2, 4, 8, 16) have token curves up to 4096 only.
//! Recorded with `$AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py` (which writes the
//! table with `scripts/fpm_table.py OUT --decode-batches 1,2,4,5,8,9,16 --decode-context
//! 256,4096,256 --prefill-kv 4096,16384 --prefill-kv-batches 1,2,4,8,16` and queries the
//! reference's `predict_prefill_latency_total` / `predict_decode_latency_total`); every value
//! within 1e-9 relative, every refusal word for word. The points off the curves are transferred
//! through Qwen3-8B's roofline on the H200 (the reference's op-level lists at their SOL).

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;
use servesim_perf::fpm_interp::FpmTable;
use servesim_perf::{estimator, AisConfig};

/// `(batch, total new tokens, total KV read, ms)`: collected sites (exact and on-curve), then
/// batches above the collected ceiling 16, priced at the ceiling (a flat batch axis, no KV),
/// then points transferred through the roofline: uncollected sites (3, 4095) and (6, 4098), a
/// KV between sites (4, 8192) whose fourth neighbour is a distance tie, a KV 16 tokens from the
/// KV-0 sites, sites whose token curves end below the point, and batches above 16 under KV
/// pressure, clamped onto a collected site and onto an uncollected one.
const PREFILL: [(u32, u32, u32, f64); 18] = [
    (1, 1024, 0, 60.539229),
    (4, 4096, 0, 230.156918),
    (3, 1002, 0, 59.233913171875),
    (16, 16384, 0, 908.627671),
    (7, 301, 0, 20.69771696875),
    (20, 4000, 0, 224.510182125),
    (32, 8192, 0, 455.676918),
    (40, 2600, 0, 147.40037759375),
    (64, 16384, 0, 908.627671),
    (3, 3000, 4095, 170.73966909130584),
    (6, 3000, 4098, 169.95942293516308),
    (4, 4096, 8192, 223.72223386007258),
    (4, 2048, 16, 116.83534614620238),
    (4, 8192, 4096, 476.3725728973631),
    (2, 6144, 16384, 450.48305386295783),
    (32, 2048, 16384, 115.95817651722606),
    (32, 2048, 8192, 115.47908066931095),
    (64, 4096, 16384, 225.4078684246302),
];

/// `(batch, total past KV, ms)`: collected batches, then uncollected ones blended from their
/// bracket rows (2/4, 5/8, 9/16), then one bracket row alone where only it covers the KV, then
/// collected batches whose own KV curve does not reach the point (transferred from the batches
/// within 2 octaves that cover it) and one on its curve.
const DECODE: [(u32, u32, f64); 20] = [
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
    (4, 20000, 10.647337140610507),
    (1, 8000, 7.980776347524019),
    (2, 9000, 8.293548160112653),
    (16, 3000, 7.219151372925245),
    (9, 40000, 15.267662444275944),
    (1, 768, 6.40628),
];

/// The table with Qwen3-8B's roofline (None, with a notice, without the reference venv's pyarrow
/// or the AIS data).
fn table() -> Option<FpmTable> {
    table_with(
        "gaps",
        &["--decode-batches", "1,2,4,5,8,9,16", "--decode-context", "256,4096,256"],
        &["--prefill-kv", "4096,16384", "--prefill-kv-batches", "1,2,4,8,16"],
    )
}

/// [`table`] written by `scripts/fpm_table.py` with `args` and `more_args`, in a directory of its own.
fn table_with(name: &str, args: &[&str], more_args: &[&str]) -> Option<FpmTable> {
    let identity = [
        "bfloat16", "bfloat16", "bfloat16", "half", "bfloat16", "1", "1", "1", "1", "1", "1", "auto", "auto", "False",
        "False", "", "full", "none", "text",
    ];
    let cfg = json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "backend_version": "0.24.0"});
    deployment_table(name, &[args, more_args].concat(), &identity, &cfg)
}

/// The table `scripts/fpm_table.py` writes with `args` for the deployment `cfg` (an estimator
/// config, the reference's keys) whose cells carry `identity` (the match columns in order).
fn deployment_table(name: &str, args: &[&str], identity: &[&str], cfg: &serde_json::Value) -> Option<FpmTable> {
    let venv = std::env::var("AISIM_REF_VENV").ok().filter(|v| !v.is_empty())?;
    let python = PathBuf::from(venv).join("bin/python");
    if !python.is_file() {
        eprintln!("NOTICE: {} missing; skipping the FPM per-pass goldens", python.display());
        return None;
    }
    let out = std::env::temp_dir().join(format!("servesim-fpm-passes-{name}-{}", std::process::id()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fpm_table.py");
    let run = Command::new(python).arg(script).arg(&out).args(args).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let identity: Vec<String> = identity.iter().map(|s| s.to_string()).collect();
    let path = out.join("fpm_forward_perf.parquet");
    let field = |k: &str| cfg[k].as_str().unwrap();
    let table =
        FpmTable::load(&path, &identity, field("model"), field("system"), field("backend"), field("backend_version"))
            .unwrap();
    match servesim_perf::systems::systems_roots(&[]) {
        Ok(roots) if roots.iter().any(|(r, _)| r.join(format!("{}.yaml", field("system"))).is_file()) => {}
        _ => {
            eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the FPM per-pass goldens");
            return None;
        }
    }
    let est = estimator(&AisConfig::from_json("config", cfg).unwrap()).unwrap();
    Some(table.with_roofline(&est).unwrap())
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * want.abs()
}

#[test]
fn single_passes_match_the_reference() {
    let Some(t) = table() else { return };
    for (batch, tokens, kv, want) in PREFILL {
        // servesim's query is per request: `batch` requests of `tokens / batch` new tokens.
        assert_eq!(tokens % batch, 0, "a uniform batch");
        let got = t.prefill_ms(batch, (tokens + kv) / batch, kv / batch).unwrap();
        assert!(close(got, want), "prefill ({batch}, {tokens}, {kv}): {got} vs reference {want}");
    }
    for (batch, kv, want) in DECODE {
        let got = t.decode_total_ms(batch, kv).unwrap();
        assert!(close(got, want), "decode ({batch}, {kv}): {got} vs reference {want}");
    }
}

/// The passes of the concurrency-20 replay golden (`tests/fpm/predict_fpm_interp_qwen3_8b_c20.yaml`,
/// its table: `--prefill-kv 1024,4096 --prefill-min-tokens 8 --decode-batches 1..24`), recorded
/// with `$AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py --chunked`: a pass is timed at
/// its iteration totals `(batch, new tokens, KV read)`, which for a chunk remainder beside whole
/// prompts are not a multiple of the batch. `(5, 4104, 1016)` is the replay's pass at t=920.465657
/// ms; `(5, 4105, 1015)` is where integer means would put it, 0.0542 ms dearer.
#[test]
fn replay_passes_are_timed_at_their_totals() {
    let batches: Vec<String> = (1..=24).map(|b| b.to_string()).collect();
    let batches = batches.join(",");
    let Some(t) = table_with(
        "chunked",
        &["--prefill-kv", "1024,4096", "--prefill-min-tokens", "8"],
        &["--decode-batches", &batches],
    ) else {
        return;
    };
    let prefill: [(u32, u64, u64, f64); 7] = [
        (5, 4104, 1016, 232.43921280256802),
        (5, 4105, 1015, 232.49339089726638),
        (8, 8192, 0, 456.313836),
        (8, 8184, 0, 455.87150127929687),
        (8, 7180, 1012, 402.5699513790757),
        (6, 5132, 1012, 289.3873596287453),
        (1, 8, 1016, 4.462788573787799),
    ];
    for (batch, tokens, kv, want) in prefill {
        let got = t.prefill_total_ms(batch, tokens, kv).unwrap();
        assert!(close(got, want), "prefill ({batch}, {tokens}, {kv}): {got} vs reference {want}");
    }
    // The per-request query lands on the means' point.
    assert!(close(t.prefill_ms(5, 1024, 203).unwrap(), 232.49339089726638));
    for (batch, kv, want) in [(15, 15368, 10.10228), (8, 8192, 8.28032), (20, 22983, 11.92643)] {
        let got = t.decode_total_ms(batch, kv).unwrap();
        assert!(close(got, want), "decode ({batch}, {kv}): {got} vs reference {want}");
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

#[test]
fn a_point_with_no_site_within_reach_is_refused_as_the_reference_does() {
    let Some(t) = table() else { return };
    // KV 100: 6 octaves from the KV-4096 sites, 100 tokens from the KV-0 ones, inside the domain.
    let err = t.prefill_ms(1, 3100, 100).unwrap_err();
    assert_eq!(
        err.message,
        "perf database error: perf_interp: no data to anchor query {batch_size=1, total_prefill_tokens=3000, \
         total_kv_read_tokens=100} (no site within max_site_distance)"
    );
}

/// The table of [`table`]'s layout for a DSA deployment: `cfg` (the estimator's config, the
/// reference's keys) and `ident` (`scripts/fpm_table.py`'s identity options, as
/// `scripts/fpm_pass_goldens.py`'s `DEPLOYMENTS` hold them) whose cells carry `identity`.
fn dsa_table(
    name: &str,
    cfg: serde_json::Value,
    ident: &[&str],
    identity: [&str; 5],
    par: [&str; 6],
) -> Option<FpmTable> {
    let layout = [
        "--decode-batches",
        "1,2,4,5,8,9,16",
        "--decode-context",
        "256,4096,256",
        "--prefill-kv",
        "4096,16384",
        "--prefill-kv-batches",
        "1,2,4,8,16",
    ];
    let tail = ["auto", "auto", "False", "False", "", "full", "none", "text"];
    let identity: Vec<&str> = identity.into_iter().chain(par).chain(tail).collect();
    deployment_table(name, &[&layout[..], ident].concat(), &identity, &cfg)
}

/// `(batch, total new tokens, total KV read, ms)` of [`PREFILL`]'s points off the collected
/// curves and `(batch, total past KV, ms)` of [`DECODE`]'s, each within 1e-9 of the reference.
fn transfers_match(t: &FpmTable, prefill: &[(u32, u64, u64, f64)], decode: &[(u32, u32, f64)]) {
    for &(batch, tokens, kv, want) in prefill {
        let got = t.prefill_total_ms(batch, tokens, kv).unwrap();
        assert!(close(got, want), "prefill ({batch}, {tokens}, {kv}): {got} vs reference {want}");
    }
    for &(batch, kv, want) in decode {
        let got = t.decode_total_ms(batch, kv).unwrap();
        assert!(close(got, want), "decode ({batch}, {kv}): {got} vs reference {want}");
    }
}

/// [`table`]'s layout for DeepSeek-V3.2 (DSA sparse attention) on an H200 TP8 under SGLang
/// 0.5.14 (fp8_block weights, fp8 KV cache): the points off the collected curves transfer
/// through the whole model's roofline, whose attention block is the DSA module's (projections,
/// indexer logits, sparse MLA over the top-k) at the per-request coordinates rounded to whole
/// tokens. Recorded with `$AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py --deployment
/// dsv32-sglang`; the collected points read the same rows as Qwen3-8B's table (the closed form
/// does not depend on the model).
#[test]
fn dsa_passes_transfer_through_the_sparse_attention_roofline() {
    let cfg = json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "sglang",
                     "backend_version": "0.5.14", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1});
    let ident = [
        "--model",
        "deepseek-ai/DeepSeek-V3.2",
        "--backend",
        "sglang",
        "--version",
        "0.5.14",
        "--cell",
        "dsv32_tp8",
        "--par",
        "tp=8,moe_tp=8",
        "--quant",
        "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,moe_quant_mode=fp8_block,kv_cache_dtype=fp8",
    ];
    let identity = ["fp8_block", "fp8_block", "bfloat16", "half", "fp8"];
    let Some(t) = dsa_table("dsv32", cfg, &ident, identity, ["8", "1", "1", "8", "1", "1"]) else { return };
    let prefill = [
        (3, 3000, 4095, 178.65991955261973),
        (6, 3000, 4098, 169.405683874128),
        (4, 4096, 8192, 234.50621063870543),
        (4, 2048, 16, 117.10442834479346),
        (4, 8192, 4096, 534.1835626648813),
        (2, 6144, 16384, 455.03007081535634),
        (32, 2048, 16384, 112.12835419871325),
        (32, 2048, 8192, 110.11014808116624),
        (64, 4096, 16384, 210.14366894308694),
    ];
    let decode = [
        (4, 20000, 8.071541431535808),
        (1, 8000, 5.012953826846151),
        (2, 9000, 4.503224579759797),
        (16, 3000, 13.597294131913685),
        (9, 40000, 9.173941503604103),
        (4, 4000, 7.220000000000001),
    ];
    transfers_match(&t, &prefill, &decode);
}

/// GLM-5.2-NVFP4 on a B200 TP8, where 57 of 78 layers reuse the top-k index: the prefill
/// roofline blends the indexer-computing and reuse layers by that fraction on both backends;
/// the decode one blends them under vLLM only (SGLang prices the indexer on every layer).
/// Recorded with `scripts/fpm_pass_goldens.py --deployment glm52-sglang` and `--deployment
/// glm52-vllm`.
#[test]
fn glm52_transfers_blend_the_reuse_layers_as_the_reference_does() {
    let ident = |backend: &'static str, version: &'static str| {
        [
            "--model",
            "nvidia/GLM-5.2-NVFP4",
            "--system",
            "b200_sxm",
            "--backend",
            backend,
            "--version",
            version,
            "--cell",
            "glm52_tp8",
            "--par",
            "tp=8,moe_tp=8",
            "--quant",
            "weight_quantization=nvfp4,gemm_quant_mode=nvfp4,moe_quant_mode=nvfp4,kv_cache_dtype=fp8",
        ]
    };
    let cfg = |backend: &str, version: &str| {
        json!({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": backend, "backend_version": version,
               "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1})
    };
    let identity = ["nvfp4", "nvfp4", "bfloat16", "half", "fp8"];
    let par = ["8", "1", "1", "8", "1", "1"];
    let Some(t) = dsa_table("glm52-sglang", cfg("sglang", "0.5.14"), &ident("sglang", "0.5.14"), identity, par) else {
        return;
    };
    let prefill = [
        (3, 3000, 4095, 173.7988002252642),
        (6, 3000, 4098, 170.03457028835118),
        (4, 8192, 4096, 484.22746208597914),
        (2, 6144, 16384, 373.1770308306051),
        (64, 4096, 16384, 220.66260883764812),
    ];
    let decode = [(4, 20000, 8.82768381506311), (1, 8000, 6.308011478825046), (16, 3000, 11.973691949615217)];
    transfers_match(&t, &prefill, &decode);
    let Some(t) = dsa_table("glm52-vllm", cfg("vllm", "0.24.0"), &ident("vllm", "0.24.0"), identity, par) else {
        return;
    };
    let prefill = [
        (3, 3000, 4095, 173.8889602362382),
        (6, 3000, 4098, 170.0272869596907),
        (4, 8192, 4096, 485.5179596571985),
        (2, 6144, 16384, 374.4024302017525),
        (64, 4096, 16384, 220.21844904664343),
    ];
    let decode = [
        (4, 20000, 8.64182586919156),
        (1, 8000, 6.05412962332588),
        (2, 9000, 5.448745614734813),
        (16, 3000, 12.354900647062134),
        (9, 40000, 9.797431770384359),
    ];
    transfers_match(&t, &prefill, &decode);
}

/// GLM-5-FP8 with SGLang prefill context parallelism 8 on an H200: the DSA block's CP
/// composition has no roofline, so a prefill off the curves is refused naming it, as the
/// reference refuses (`scripts/fpm_pass_goldens.py --deployment glm5-cp8-sglang`: "...; SOL
/// roofline unavailable: SOL estimation not implemented: forward_model='fpm' SOL roofline has no
/// Rust implementation for DSA context parallelism (cp_size=8) on op context_attention"); a
/// decode step, which CP leaves whole, still transfers.
#[test]
fn dsa_prefill_context_parallelism_has_no_fpm_roofline() {
    let cfg = json!({"model": "zai-org/GLM-5-FP8", "system": "h200_sxm", "backend": "sglang",
                     "backend_version": "0.5.14", "tp": 1, "moe_tp_size": 1, "moe_ep_size": 8, "cp_size": 8});
    let ident = [
        "--model",
        "zai-org/GLM-5-FP8",
        "--backend",
        "sglang",
        "--version",
        "0.5.14",
        "--cell",
        "glm5_cp8",
        "--par",
        "cp=8,moe_ep=8",
        "--quant",
        "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,moe_quant_mode=fp8_block,kv_cache_dtype=fp8",
    ];
    let identity = ["fp8_block", "fp8_block", "bfloat16", "half", "fp8"];
    let Some(t) = dsa_table("glm5-cp8", cfg, &ident, identity, ["1", "1", "1", "1", "8", "8"]) else { return };
    let err = t.prefill_total_ms(3, 3000, 4095).unwrap_err().message;
    assert!(
        err.starts_with(
            "perf database error: perf_interp: no data to anchor query {batch_size=3, total_prefill_tokens=3000, \
             total_kv_read_tokens=4095} (no usable neighbour site); SOL roofline unavailable: "
        ),
        "{err}"
    );
    assert!(
        err.contains("forward_model='fpm' SOL roofline has no implementation for DSA context parallelism (cp_size=8)"),
        "{err}"
    );
    assert!(err.contains("context_attention"), "{err}");
    transfers_match(&t, &[(1, 1024, 0, 60.539229)], &[(4, 20000, 9.399831546232898), (16, 3000, 10.663565522333714)]);
}

/// Decode context parallelism: the reference interpolates a DCP cell's measured points but
/// transfers none through the roofline (probed on DeepSeek-V3.2 vLLM 0.24.0 TP8 dcp 2, a table
/// with a `dcp` column of 2: "...; SOL roofline unavailable: unsupported model for Rust core
/// estimator: DCP FPM supports measured interpolation, not op-level SOL transfer"). The roofline
/// of a dcp-2 deployment is attached to a cell without DCP here: its collected points still
/// read, its transfers are refused in those words (whatever cell the roofline is attached to).
#[test]
fn decode_context_parallelism_has_no_fpm_roofline() {
    let cfg = json!({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "vllm",
                     "backend_version": "0.24.0", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2});
    let ident = [
        "--model",
        "deepseek-ai/DeepSeek-V3.2",
        "--backend",
        "vllm",
        "--cell",
        "dsv32_tp8",
        "--par",
        "tp=8,moe_tp=8",
        "--quant",
        "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,moe_quant_mode=fp8_block,kv_cache_dtype=fp8",
    ];
    let identity = ["fp8_block", "fp8_block", "bfloat16", "half", "fp8"];
    let Some(t) = dsa_table("dsv32-dcp2", cfg, &ident, identity, ["8", "1", "1", "8", "1", "1"]) else { return };
    transfers_match(&t, &[(1, 1024, 0, 60.539229)], &[(4, 4000, 7.220000000000001), (3, 3000, 6.965)]);
    for err in [t.decode_total_ms(4, 20000).unwrap_err(), t.prefill_total_ms(3, 3000, 4095).unwrap_err()] {
        assert!(
            err.message.ends_with(
                "SOL roofline unavailable: dcp=2: DCP FPM supports measured interpolation, not op-level SOL transfer \
                 (as in the reference)"
            ),
            "{}",
            err.message
        );
    }
}

/// The table `scripts/fpm_pass_goldens.py --deployment q30-dcp{1,2}-vllm` writes: [`table`]'s
/// layout for Qwen3-30B-A3B on an H200 TP8 (moe_tp 8) under vLLM 0.24.0 with a `dcp` column
/// holding a dcp-1 and a dcp-2 cell (`scripts/fpm_table.py ... --dcp 1,2`: the dcp-2 cell's
/// decode rows are timed over the KV stripe), the cell of the stated `dcp` selected.
fn dcp_table(name: &str, dcp: u32) -> Option<FpmTable> {
    let args = [
        "--decode-batches",
        "1,2,4,5,8,9,16",
        "--decode-context",
        "256,4096,256",
        "--prefill-kv",
        "4096,16384",
        "--prefill-kv-batches",
        "1,2,4,8,16",
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "--cell",
        "q30_tp8",
        "--par",
        "tp=8,moe_tp=8",
        "--dcp",
        "1,2",
    ];
    let dcp_label = dcp.to_string();
    let identity = [
        "bfloat16", "bfloat16", "bfloat16", "half", "bfloat16", "8", "1", "1", "8", "1", "1", "auto", "auto", "False",
        "False", "", "full", "none", "text", &dcp_label,
    ];
    let cfg = json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm",
                     "backend_version": "0.24.0", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": dcp});
    deployment_table(name, &args, &identity, &cfg)
}

/// A table recording decode context parallelism: a deployment stating dcp 2 reads the dcp-2
/// cell's measured curves (on-curve points, rung brackets, the batch clamp) at the whole DCP
/// group's iteration totals, and refuses every point the curves do not reach in the reference's
/// words; one stating dcp 1 reads the dcp-1 cell and transfers through Qwen3-30B-A3B's roofline.
/// Recorded with `$AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py --deployment
/// q30-dcp2-vllm` and `--deployment q30-dcp1-vllm`; every value within 1e-9 relative.
#[test]
fn a_dcp_cell_is_read_from_its_measured_curves_only() {
    let Some(t) = dcp_table("q30-dcp2", 2) else { return };
    // The collected prefill points read as without DCP (the closed form's prefill rows are the
    // same in both cells); the decode rows are the dcp-2 cell's, striped.
    let prefill = [(1, 1024, 0, 60.539229), (3, 1002, 0, 59.233913171875), (20, 4000, 0, 224.510182125)];
    let decode = [
        (4, 4000, 6.81),
        (16, 16000, 8.610000000000001),
        (2, 2207, 6.531735),
        (3, 7501, 7.132605),
        (15, 45005, 11.655525),
        (12, 40000, 11.13),
        (14, 3000, 6.93),
        (1, 768, 6.33564),
    ];
    transfers_match(&t, &prefill, &decode);
    let transfer = "(no usable neighbour site); SOL roofline unavailable: dcp=2: DCP FPM supports measured \
                    interpolation, not op-level SOL transfer (as in the reference)";
    for (batch, tokens, kv) in [(3, 3000, 4095), (4, 4096, 8192), (4, 2048, 16), (2, 6144, 16384)] {
        let err = t.prefill_total_ms(batch, tokens, kv).unwrap_err().message;
        let query =
            format!("perf_interp: no data to anchor query {{batch_size={batch}, total_prefill_tokens={tokens}, total_kv_read_tokens={kv}}} ");
        assert!(err.starts_with(&format!("perf database error: {query}")) && err.ends_with(transfer), "{err}");
    }
    for (batch, kv) in [(4, 20000), (1, 8000), (16, 3000), (9, 40000)] {
        let err = t.decode_total_ms(batch, kv).unwrap_err().message;
        let query = format!("perf_interp: no data to anchor query {{batch_size={batch}, total_kv_read_tokens={kv}}} ");
        assert!(err.starts_with(&format!("perf database error: {query}")) && err.ends_with(transfer), "{err}");
    }
    // A batch above the ceiling under KV pressure needs the roofline to clamp: it stays, and the
    // domain refuses it.
    let err = t.prefill_total_ms(32, 2048, 16384).unwrap_err().message;
    assert!(
        err.starts_with("perf database error: FPM prefill query batch_size=32 is outside the collected domain [1, 16]")
    );

    let Some(t) = dcp_table("q30-dcp1", 1) else { return };
    let prefill = [
        (3, 3000, 4095, 170.87247518646026),
        (6, 3000, 4098, 170.0318942961223),
        (4, 4096, 8192, 226.0687387344936),
        (4, 2048, 16, 116.86024178371596),
        (4, 8192, 4096, 473.1881046167015),
        (2, 6144, 16384, 431.4661136047589),
        (32, 2048, 16384, 116.49019502977272),
        (32, 2048, 8192, 116.10198316198036),
        (64, 4096, 16384, 226.6772805848583),
    ];
    let decode = [
        (4, 4000, 7.220000000000001),
        (15, 45005, 16.37105),
        (4, 20000, 8.214272576234144),
        (1, 8000, 4.871579370522879),
        (2, 9000, 4.415052011364483),
        (16, 3000, 13.962434543778095),
        (9, 40000, 9.636886939925224),
    ];
    transfers_match(&t, &prefill, &decode);
}
