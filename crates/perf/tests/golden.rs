//! Goldens against the reference estimator (aisimulate 0.13.0.dev202610270000000085,
//! `aisimulate_core` data). They run only when the data is installed; otherwise each test prints
//! a notice and passes.
//!
//! Every number comes from `scripts/ais_goldens.py`, run with the reference venv's python
//! (`$AISIM_REF_VENV/bin/python scripts/ais_goldens.py`): `RustForwardPassPerfModel.best_available(cfg)`
//! then `static_phase_diagnostics(...)` summed over ops (prefill, and decode at
//! `context_length = context − 1`) or `estimate_forward_pass_time_ms` (forward passes, the
//! slowest attention-DP rank), and `estimate_num_gpu_blocks` for KV capacity.

use serde_json::json;
use servesim_perf::{estimator, AisConfig, RankMetrics};

mod common;
use common::{data_available, est_with, MIXED};

fn close(got: f64, want: f64) {
    common::close_to(got, want, 1e-9);
}

fn est(model: &str, system: &str, backend: &str, tp: u32) -> std::sync::Arc<servesim_perf::Estimator> {
    est_with(json!({"model": model, "system": system, "backend": backend, "worker_type": "aggregated", "tp": tp}))
}

#[test]
fn reference_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the reference goldens");
        return;
    }
    let q = est("Qwen/Qwen3-32B", "h200_sxm", "vllm", 2);
    close(q.prefill_ms(1, 1024, 0).unwrap(), 53.67781995651973);
    close(q.prefill_ms(2, 2500, 700).unwrap(), 197.72663502776066);
    close(q.prefill_ms(3, 33000, 0).unwrap(), 7844.4516481275905);
    close(q.decode_ms(16, 1100).unwrap(), 13.281420129614514);
    close(q.decode_ms(7, 131072).unwrap(), 40.259631708522);
    let mixed = MIXED;
    close(q.forward_pass_time_ms(&[mixed]).unwrap(), 116.17427907458445);
    // Attention DP: the slowest rank.
    close(q.forward_pass_time_ms(&[RankMetrics::default(), mixed]).unwrap(), 116.17427907458445);
    let l = est("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "sglang", 1);
    close(l.prefill_ms(4, 777, 0).unwrap(), 67.63373369897943);
    close(l.decode_ms(256, 8000).unwrap(), 94.34212156827148);
    close(l.decode_ms(1024, 1024).unwrap(), 69.55970436565147);
    let s = est("Qwen/Qwen3-8B", "h100_sxm", "vllm", 4);
    close(s.prefill_ms(1, 20000, 0).unwrap(), 216.40299066515905);
    close(s.decode_ms(33, 5000).unwrap(), 6.250786712240968);
}

#[test]
fn moe_reference_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the MoE reference goldens");
        return;
    }
    // Expert parallelism on vLLM: the dispatch is the tensor-parallel custom all-reduce.
    let q = est_with(json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                            "moe_tp_size": 1, "moe_ep_size": 2}));
    close(q.prefill_ms(4, 1000, 0).unwrap(), 48.22585807358528);
    close(q.prefill_ms(2, 2500, 700).unwrap(), 46.71942624461286);
    close(q.prefill_ms(1, 20000, 0).unwrap(), 300.91635402089423); // past the 16384-token curve
    close(q.decode_ms(16, 1100).unwrap(), 8.869965539348005);
    close(q.decode_ms(1024, 1024).unwrap(), 34.87906427893911);
    close(q.forward_pass_time_ms(&[MIXED]).unwrap(), 35.3331887805247);
    // Expert tensor parallelism on SGLang.
    let big = est_with(json!({"model": "Qwen/Qwen3-235B-A22B", "system": "h100_sxm", "backend": "sglang", "tp": 4,
                              "moe_tp_size": 4, "moe_ep_size": 1}));
    close(big.prefill_ms(1, 8192, 0).unwrap(), 324.1668455885498);
    close(big.decode_ms(64, 4097).unwrap(), 50.39256655106643);
    // gpt-oss (sliding-window half, mxfp4 experts) with attention DP: NCCL dispatch, experts see
    // both ranks' tokens, the forward pass is the slower rank.
    let oss = est_with(json!({"model": "openai/gpt-oss-20b", "system": "h200_sxm", "backend": "trtllm", "tp": 1,
                              "attention_dp": 2, "moe_tp_size": 1, "moe_ep_size": 2}));
    close(oss.prefill_ms(2, 3000, 0).unwrap(), 140.95692984561643);
    close(oss.decode_ms(33, 5000).unwrap(), 7.181261072963873);
    let decoding = RankMetrics { num_decode_requests: 40, sum_decode_kv_tokens: 120_000, ..Default::default() };
    close(oss.forward_pass_time_ms(&[MIXED, decoding]).unwrap(), 55.59446378227148);
    // An fp8 block-quantised checkpoint: fp8_block GEMMs and experts, fp8 KV, bf16 FMHA on vLLM.
    let fp8 = est_with(json!({"model": "Qwen/Qwen3-30B-A3B-FP8", "system": "h100_sxm", "backend": "vllm", "tp": 2,
                              "moe_tp_size": 2, "moe_ep_size": 1}));
    close(fp8.prefill_ms(4, 777, 0).unwrap(), 40.56524047873351);
    close(fp8.decode_ms(128, 1500).unwrap(), 14.332068046824052);
    // MiniMax-M2.7: the plain MoE graph with per-layer Q/K norms, fp8-block, 256 experts top-8,
    // experts split by EP.
    let minimax = est_with(json!({"model": "MiniMaxAI/MiniMax-M2.7", "system": "h200_sxm", "backend": "sglang",
                                  "tp": 4, "moe_tp_size": 1, "moe_ep_size": 4}));
    close(minimax.prefill_ms(2, 3000, 500).unwrap(), 103.12238204833321);
    close(minimax.decode_ms(64, 2049).unwrap(), 20.314498111294206);
}

/// DeepSeek-V3 (MLA + shared and routed experts, fp8 block checkpoint) on H200, from the
/// reference's `RustForwardPassPerfModel.best_available(...)`: `static_phase_diagnostics`
/// summed (decode at `context_length = c − 1`) and `estimate_forward_pass_time_ms` for the
/// mixed pass (recorded with /tmp/mla/gold.py and sum.py).
#[test]
fn mla_reference_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the MLA reference goldens");
        return;
    }
    let ds = |extra: serde_json::Value| {
        let mut v = json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm"});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        est_with(v)
    };
    // TP8 with the experts split by TP: vLLM answers from the fused MLA module table, SGLang
    // falls back to the granular chain (its module table has no Hopper rows), TRT-LLM reads its own.
    for (backend, prefill, decode) in [
        ("vllm", 120.72093234068687, 17.423641360025385),
        ("sglang", 95.9851509156165, 13.717996626650763),
        ("trtllm", 150.13856410098114, 16.786883132550564),
    ] {
        let e = ds(json!({"backend": backend, "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1}));
        close(e.prefill_ms(2, 1000, 0).unwrap(), prefill);
        close(e.decode_ms(8, 2048).unwrap(), decode);
    }
    // DEP on SGLang: attention DP 8 over expert parallelism 8.
    let dep = ds(json!({"backend": "sglang", "tp": 1, "attention_dp": 8, "moe_tp_size": 1, "moe_ep_size": 8}));
    close(dep.prefill_ms(2, 2500, 700).unwrap(), 1075.3392237202806);
    close(dep.decode_ms(64, 4097).unwrap(), 77.39129171500798);
    close(dep.forward_pass_time_ms(&[MIXED]).unwrap(), 768.7309095179797);
    // TEP on vLLM with one MTP layer.
    let tep = ds(json!({"backend": "vllm", "tp": 8, "moe_tp_size": 1, "moe_ep_size": 8, "nextn": 1}));
    close(tep.prefill_ms(1, 8192, 0).unwrap(), 460.2743836130518);
    close(tep.decode_ms(16, 1100).unwrap(), 26.67833405387492);
    close(tep.forward_pass_time_ms(&[MIXED]).unwrap(), 146.73330673037947);
    // The latent KV: 61 layers × (512 + 64) elements × 1 byte (fp8), not split by TP — the
    // reference's `kv_size_per_token_bytes` of `estimate_num_gpu_blocks`.
    assert_eq!(tep.kv_bytes_per_token(), 35136.0);
}

/// The engine-facing timer asks what Dynamo 1.6.1's AIS session asks: a decode step at mean
/// context `c` reads `c + 1` tokens of KV per request (`sum_decode_kv_tokens = batch × (c + 1)`).
#[test]
fn timer_follows_dynamos_session() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let cfg = json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2,
                     "moe_tp_size": 1, "moe_ep_size": 2});
    let timer = servesim_perf::build_timer("timing_model.config", "ais", &cfg).unwrap();
    close(timer.prefill_ms(2, 2500, 700).unwrap(), 46.71942624461286);
    close(timer.decode_ms(16, 16 * 1100, 1 << 20).unwrap(), 8.869981339340258);
    // The integer mean of the batch's context, as Dynamo computes it.
    close(timer.decode_ms(16, 16 * 1100 + 15, 1 << 20).unwrap(), 8.869981339340258);
}

#[test]
fn moe_errors_with_real_data() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let bad = |v: serde_json::Value| estimator(&AisConfig::from_json("config", &v).unwrap()).unwrap_err().message;
    // The reference defaults both expert widths to 1 and refuses a layout they do not cover.
    let e = bad(json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2}));
    assert!(
        e.contains("moe_tp_size × moe_ep_size (1 × 1, unset values default to 1) must equal tp × attention_dp (2 × 1)"),
        "{e}"
    );
    let e = bad(json!({"model": "Qwen/Qwen3-30B-A3B-FP8", "system": "h200_sxm", "backend": "vllm", "tp": 4,
                       "moe_tp_size": 4, "moe_ep_size": 1}));
    assert!(e.contains("fp8_block experts need (moe_intermediate_size 768 / moe_tp_size 4)"), "{e}");
    // A layout the MoE table does not hold: named, with the layouts it does hold.
    let oss = est_with(json!({"model": "openai/gpt-oss-20b", "system": "h100_sxm", "backend": "trtllm", "tp": 2,
                              "moe_tp_size": 2, "moe_ep_size": 1}));
    let e = oss.prefill_ms(1, 1000, 0).unwrap_err().message;
    assert!(e.contains("op context_moe: no w4a16_mxfp4 MoE data for topk=4 experts=32 hidden=2880 inter=2880 at moe_tp=2 × moe_ep=1"), "{e}");
    assert!(e.contains("collected moe_tp × moe_ep for this shape: 1×1, 1×2") && e.contains("moe_perf.parquet"), "{e}");
}

#[test]
fn clear_errors_with_real_data() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let bad = |v: serde_json::Value| estimator(&AisConfig::from_json("config", &v).unwrap()).unwrap_err().message;
    let e = bad(json!({"model": "Qwen/Qwen3-8B", "system": "h999", "backend": "vllm"}));
    assert!(e.contains("unknown GPU system \"h999\"") && e.contains("h200_sxm"), "{e}");
    let e = bad(json!({"model": "deepseek-ai/DeepSeek-V4.1-Flash", "system": "h200_sxm", "backend": "vllm"}));
    // DeepSeek-V4.1 is timed from an execution profile's module table, which the main root lacks.
    assert!(
        e.contains("DeepSeek-V4.1 needs dsv41_module_perf.parquet for h200_sxm / vllm") && e.contains("profiles/dsv41"),
        "{e}"
    );
    // NVFP4 needs fp4 tensor cores, which Hopper lacks (the reference fails its first query).
    let e = bad(json!({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                       "moe_tp_size": 8, "moe_ep_size": 1}));
    assert!(e.contains("nvfp4 compute needs gpu.fp4_tc_flops in h200_sxm.yaml"), "{e}");
    let e = bad(json!({"model": "no/such-model", "system": "h200_sxm", "backend": "vllm"}));
    assert!(e.contains("no--such-model_config.json"), "{e}");
    let e =
        bad(json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "backend_version": "0.19.0"}));
    assert!(e.contains("not a queryable version") && e.contains("current = 0.24.0"), "{e}");
}

/// An aggregated estimator of each config against the reference's prefill at four shapes, one
/// decode step and the mixed pass, in that order (`want`).
fn check_layout_steps(cases: impl IntoIterator<Item = (serde_json::Value, [f64; 6])>) {
    for (mut cfg, want) in cases {
        cfg["worker_type"] = json!("aggregated");
        let e = est_with(cfg);
        close(e.prefill_ms(1, 1024, 0).unwrap(), want[0]);
        close(e.prefill_ms(2, 2500, 700).unwrap(), want[1]);
        close(e.prefill_ms(3, 33000, 0).unwrap(), want[2]);
        close(e.prefill_ms(1, 1001, 0).unwrap(), want[3]);
        close(e.decode_ms(16, 1100).unwrap(), want[4]);
        close(e.forward_pass_time_ms(&[MIXED]).unwrap(), want[5]);
    }
}

/// The error an estimator of `cfg` is refused with.
fn refuse(cfg: serde_json::Value) -> String {
    estimator(&AisConfig::from_json("config", &cfg).unwrap()).map(|_| ()).unwrap_err().to_string()
}

/// Pipeline parallelism (`pp`: the stages' activation hand-offs, `(pp − 1)` P2P sends per pass)
/// and SGLang prefill context parallelism (`cp_size`: each rank's share of the prompt, rank 0's
/// two zigzag attention chunks, the per-layer KV all-gather; decode untouched):
/// `RustForwardPassPerfModel.best_available(cfg)` as in `reference_goldens`.
#[test]
fn pipeline_and_prefill_cp_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the pp / cp goldens");
        return;
    }
    let cases = [
        (
            json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "pp": 2}),
            [
                53.89753515651973,
                198.47391502776065,
                7864.736848127591,
                52.99807381994978,
                13.294696929614513,
                116.61435907458444,
            ],
        ),
        (
            json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2}),
            [
                53.13951200807428,
                181.685822370824,
                7792.970763248065,
                52.28106342869524,
                21.283551815639576,
                125.07625715894521,
            ],
        ),
        (
            json!({"model": "Qwen/Qwen3-8B", "system": "h100_sxm", "backend": "sglang", "tp": 1, "cp_size": 4}),
            [
                11.369433493424394,
                24.90660527932418,
                987.9559124502766,
                11.35970668485144,
                8.564053538917905,
                21.447386386278225,
            ],
        ),
    ];
    check_layout_steps(cases);
    // The reference's layout rules: prefill CP on SGLang only (its model classes claim no other
    // backend), as a pure-CP attention group.
    let e = refuse(json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "cp_size": 2}));
    assert!(e.contains("is not supported for model_family='LLAMA' on backend='vllm'"), "{e}");
    let e =
        refuse(json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "sglang", "tp": 2, "cp_size": 2}));
    assert!(e.contains("sglang CP requires tp_size=1 and attention_dp_size=1"), "{e}");
}

/// SGLang prefill context parallelism on the MLA family (DeepSeek-V3 / R1 / V3.1, Kimi-K2.5):
/// the fused attention module at the whole prompt with its layers shared by the CP ranks, the
/// granular chain's context kernel in rank 0's two zigzag chunks (DeepSeek-V3.1-NVFP4, whose
/// mixed projection formats have no module row), one latent-KV all-gather per layer, the
/// dispatch gathering the split prompt, the pipeline hand-off moving the whole prompt; decode
/// runs replicated, its combine all-reducing over the CP ranks (an MTP layer on Kimi-K2.5).
/// Recorded with `scripts/ais_goldens.py --mla-cp`. DSA and DeepSeek-V4 CP stay refused.
#[test]
fn mla_prefill_cp_goldens() {
    if !data_available("h200_sxm") || !data_available("b200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the MLA CP goldens");
        return;
    }
    let cases = [
        (
            json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 1, "pp": 2, "cp_size": 4, "moe_tp_size": 1, "moe_ep_size": 4}),
            [
                90.23836181740819,
                233.15793369688305,
                15054.110467340228,
                89.43209085970662,
                34.514480058902045,
                188.70396263038162,
            ],
        ),
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2, "moe_tp_size": 1, "moe_ep_size": 2, "nextn": 1}),
            [
                240.91021309291972,
                605.4244506041387,
                33651.54639648413,
                238.28020658539594,
                46.74643533679505,
                497.0737103981081,
            ],
        ),
        (
            json!({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2, "moe_tp_size": 1, "moe_ep_size": 2}),
            [
                55.67552613756279,
                106.55861812000235,
                4247.223668441445,
                55.224035694916616,
                17.63899857422669,
                81.7132636683896,
            ],
        ),
    ];
    check_layout_steps(cases);
    // DSA and DeepSeek-V4 take prefill CP (`dcp.rs`'s and `dsv4.rs`'s tests). The reference's
    // MiniMax-M3, Qwen3.5, Nemotron-H and Kimi-K3 classes claim none: refused in its words
    // (`aisimulate_core.sdk.models.get_model` with op_level estimation), before any family
    // check of servesim's; every family claims it on SGLang only.
    for (model, family, dense) in [
        ("MiniMaxAI/MiniMax-M3", "MINIMAXM3", false),
        ("Qwen/Qwen3.5-35B-A3B", "QWEN35", false),
        ("Qwen/Qwen3.5-27B", "QWEN35", true),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NEMOTRONH", false),
        ("moonshotai/Kimi-K3", "KIMIK3", false),
        ("Qwen/Qwen3-32B", "LLAMA", true),
    ] {
        for backend in ["sglang", "vllm"] {
            if family == "LLAMA" && backend == "sglang" {
                continue;
            }
            let mut c = json!({"model": model, "system": "h200_sxm", "backend": backend, "cp_size": 2});
            if !dense {
                c["moe_tp_size"] = json!(1);
                c["moe_ep_size"] = json!(2);
            }
            assert_eq!(
                refuse(c),
                format!(
                    "Context parallelism (cp_size=2) is not supported for model_family='{family}' on \
                     backend='{backend}'. The model class must override ``supports_cp`` and implement CP in its \
                     op pipeline."
                ),
                "{model} {backend}"
            );
        }
    }
}

/// `aisimulate_core.sdk.memory.kv_cache.estimate_num_gpu_blocks(model, system, backend,
/// scheduler_block_size=B, max_num_tokens=8192, max_batch_size=256, memory_fraction_kind="of_total",
/// memory_fraction_value=0.9 (vllm) / 0.88 (sglang), tp_size=T)` (recorded with /tmp/kv.py).
#[test]
fn kv_capacity_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the KV capacity goldens");
        return;
    }
    use servesim_perf::memory::kv_capacity;
    for (model, system, backend, tp, block, want) in [
        ("Qwen/Qwen3-32B", "h200_sxm", "vllm", 2, 64, 11742u64),
        ("Qwen/Qwen3-8B", "h100_sxm", "vllm", 1, 64, 5979),
        ("Qwen/Qwen3-32B", "h200_sxm", "sglang", 2, 1, 733828),
        ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "vllm", 4, 16, 28376),
    ] {
        let e = est(model, system, backend, tp);
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{model} {system} {backend} tp{tp}: {got:?}");
    }
    // Pipeline stages hold 1/pp of the weights but (the reference's sizing) every layer's KV of
    // a token; prefill CP ranks hold
    // the whole model and the whole KV (recorded as above with pp_size / cp_size).
    for (cfg, block, want) in [
        (json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "pp": 2}), 64, 5856u64),
        (json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "pp": 2}), 64, 13695),
        (json!({"model": "Qwen/Qwen3-8B", "system": "h100_sxm", "backend": "sglang", "pp": 2}), 1, 430178),
        (
            json!({"model": "meta-llama/Meta-Llama-3.1-70B", "system": "h100_sxm", "backend": "vllm", "tp": 2, "pp": 4}),
            16,
            20859,
        ),
        (
            json!({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "pp": 2,
                   "moe_tp_size": 1, "moe_ep_size": 2}),
            64,
            36923,
        ),
        (json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "sglang", "cp_size": 2}), 1, 243142),
        (json!({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "sglang", "cp_size": 4}), 1, 765519),
        // MLA under prefill CP: the graph's weights, without SGLang's dense-layer correction
        // (recorded with `scripts/ais_goldens.py --mla-cp`).
        (
            json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "cp_size": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            1,
            719046,
        ),
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "cp_size": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            1,
            598293,
        ),
    ] {
        let e = est_with(cfg.clone());
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{cfg}: {got:?}");
    }
    // Mixture of experts: expert weights split over moe_tp × moe_ep; gpt-oss's sliding-window
    // half holds at most 128 tokens of a sequence.
    for (model, system, backend, tp, moe_tp, moe_ep, block, want) in [
        ("Qwen/Qwen3-30B-A3B", "h200_sxm", "vllm", 2, 1, 2, 64, 32118u64),
        ("Qwen/Qwen3-235B-A22B", "h200_sxm", "sglang", 4, 4, 1, 1, 240825),
        ("Qwen/Qwen3-30B-A3B-FP8", "h100_sxm", "vllm", 1, 1, 1, 16, 52808),
        ("openai/gpt-oss-20b", "h100_sxm", "vllm", 1, 1, 1, 16, 152791),
        ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", 4, 4, 1, 64, 36337),
    ] {
        let e = est_with(json!({"model": model, "system": system, "backend": backend, "tp": tp,
                                "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}));
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{model} {system} {backend} tp{tp}: {got:?}");
    }
    // MLA (DeepSeek-V3 / R1): the graph's weights with the granular MLA projections, the whole
    // vocabulary embedded, the MoE block-scale workspace in the activations; SGLang's resident
    // weights corrected for the dense first layers (recorded with /tmp/mla/kv.py, as above plus
    // attention_dp_size; TRT-LLM `memory_fraction_kind="of_free"`).
    for (model, system, backend, tp, moe_tp, moe_ep, dp, block, want) in [
        ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", 8, 8, 1, 1, 64, 16147u64),
        ("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", 8, 8, 1, 1, 1, 1246077),
        ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", 8, 1, 8, 1, 16, 70438),
        ("deepseek-ai/DeepSeek-R1", "h200_sxm", "sglang", 1, 1, 8, 8, 64, 12650),
        ("deepseek-ai/DeepSeek-R1", "h200_sxm", "sglang", 8, 1, 8, 1, 64, 19469),
        ("deepseek-ai/DeepSeek-V3", "b200_sxm", "vllm", 4, 1, 8, 2, 64, 33325),
        ("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", 8, 8, 1, 1, 32, 41183),
    ] {
        let e = est_with(json!({"model": model, "system": system, "backend": backend, "tp": tp, "attention_dp": dp,
                                "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}));
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{model} {system} {backend} tp{tp} dp{dp} {moe_tp}×{moe_ep}: {got:?}");
    }
}

/// Checkpoint formats beyond bf16 / fp8 / fp8-block, from `scripts/ais_goldens.py` (its
/// static-FP8 and NVFP4 entries): static per-tensor FP8 (the fp8 GEMM minus the scale kernels a
/// calibrated scheme skips), NVFP4 GEMMs and experts on Blackwell (TRT-LLM's low-latency expert
/// kernel at 64 tokens, its quantised all-gather under attention DP), an NVFP4 DeepSeek that
/// keeps its q / kv projections in bf16, and the Kimi-K2.5 family (INT4 and NVFP4).
#[test]
fn checkpoint_format_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the checkpoint-format goldens");
        return;
    }
    let qs = est("Qwen/Qwen3-32B-FP8-Static-PerTensor", "h200_sxm", "vllm", 1);
    close(qs.prefill_ms(2, 2500, 700).unwrap(), 235.6018864120982);
    close(qs.decode_ms(64, 2049).unwrap(), 20.209802123139827);
    let ls = est("nvidia/Llama-3.1-70B-Instruct-FP8", "h200_sxm", "sglang", 2);
    close(ls.prefill_ms(1, 8192, 0).unwrap(), 680.208942925153);
    close(ls.decode_ms(16, 1100).unwrap(), 12.617615346257516);
    let q4 = est_with(json!({"model": "nvidia/Qwen3-235B-A22B-NVFP4", "system": "b200_sxm", "backend": "trtllm",
                             "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1}));
    close(q4.prefill_ms(2, 3000, 0).unwrap(), 146.24762205719372);
    close(q4.decode_ms(64, 2049).unwrap(), 14.665337552189282);
    close(q4.decode_ms(256, 1100).unwrap(), 31.250775590862624);
    let q4dp = est_with(json!({"model": "nvidia/Qwen3-235B-A22B-NVFP4", "system": "b200_sxm", "backend": "trtllm",
                               "tp": 2, "attention_dp": 2, "moe_tp_size": 1, "moe_ep_size": 4}));
    let decoding = RankMetrics { num_decode_requests: 40, sum_decode_kv_tokens: 120_000, ..Default::default() };
    close(q4dp.forward_pass_time_ms(&[MIXED, decoding]).unwrap(), 79.35491019678243);
    let mm = est_with(json!({"model": "nvidia/MiniMax-M2.7-NVFP4", "system": "b200_sxm", "backend": "vllm",
                             "tp": 2, "moe_tp_size": 1, "moe_ep_size": 2}));
    close(mm.prefill_ms(4, 777, 0).unwrap(), 37.917976237461865);
    close(mm.decode_ms(33, 5000).unwrap(), 12.271884799415592);
    for (backend, tp, dp, prefill, decode) in
        [("vllm", 8, 1, 53.35791299265952, 13.292453809620039), ("sglang", 4, 2, 64.89406949525048, 13.640179700450558)]
    {
        let ds = est_with(json!({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": backend,
                                 "tp": tp, "attention_dp": dp, "moe_tp_size": 1, "moe_ep_size": 8}));
        close(ds.prefill_ms(2, 1000, 0).unwrap(), prefill);
        close(ds.decode_ms(16, 1100).unwrap(), decode);
    }
    // Kimi-K2.5 / K2.6 / K2.7: DeepSeek-V3's text model under text_config. moonshotai/Kimi-K2.5
    // (compressed-tensors INT4) has int4_wo experts and bf16 everything else; the NVFP4 releases
    // keep the attention block (K2.6 / K2.7 also the shared experts) in bf16.
    for (cfg, prefill, decode) in [
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            143.19119174184985,
            15.219009717812867,
        ),
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            164.34429996908727,
            20.38071917627135,
        ),
        (
            json!({"model": "nvidia/Kimi-K2.5-NVFP4", "system": "b200_sxm", "backend": "trtllm", "tp": 4,
                   "attention_dp": 2, "moe_tp_size": 1, "moe_ep_size": 8}),
            55.923201453800715,
            13.67403038670968,
        ),
        (
            json!({"model": "nvidia/Kimi-K2.6-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            51.7160563418624,
            14.121788966138535,
        ),
        (
            json!({"model": "nvidia/Kimi-K2.7-Code-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            44.38969782801036,
            9.896684273196927,
        ),
    ] {
        let e = est_with(cfg);
        close(e.prefill_ms(2, 1000, 0).unwrap(), prefill);
        close(e.decode_ms(16, 1100).unwrap(), decode);
    }
    // KV capacity: 9/16 byte NVFP4 weights, 1-byte static FP8, bf16 DeepSeek q / kv projections,
    // half-byte INT4 experts (Kimi-K2.5; its vision tower holds no memory on a text-only load).
    use servesim_perf::memory::kv_capacity;
    for (cfg, want, block) in [
        (
            json!({"model": "Qwen/Qwen3-32B-FP8-Static-PerTensor", "system": "h200_sxm", "backend": "vllm", "tp": 1}),
            11528u64,
            64,
        ),
        (
            json!({"model": "nvidia/Qwen3-235B-A22B-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 4,
                   "moe_tp_size": 4, "moe_ep_size": 1}),
            87752,
            64,
        ),
        (
            json!({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            50738,
            64,
        ),
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            13102,
            64,
        ),
        (
            json!({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            819910,
            1,
        ),
        (
            json!({"model": "nvidia/Kimi-K2.7-Code-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8,
                   "moe_tp_size": 1, "moe_ep_size": 8}),
            39380,
            64,
        ),
    ] {
        let e = est_with(cfg.clone());
        let got = kv_capacity(&e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{cfg}: {got:?}");
    }
}

/// DeepSeek sparse attention (reference numbers from
/// `$AISIM_REF_VENV/bin/python scripts/ais_goldens.py`): the DSA module tables; SGLang's dense
/// first layers timed apart; GLM-5.2's reuse layers (21 of 78 compute the top-k index) blended
/// in; NVFP4 releases keeping q / kv / indexer (DeepSeek-V3.2) or the whole attention block and
/// shared experts (GLM-5.2) in bf16; KV with the indexer's key cache. Mixed passes time the DSA
/// block (the pass's `context_attention`) apart at the prefill shape, not over the whole pass's
/// tokens as one prompt (369.68 ms here, where that gave 325.6).
#[test]
fn dsa_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the DSA goldens");
        return;
    }
    let layout = |model: &str, system: &str, backend: &str, moe_tp: u32, moe_ep: u32| {
        est_with(json!({"model": model, "system": system, "backend": backend, "tp": 8,
                        "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
    };
    let v32 = layout("deepseek-ai/DeepSeek-V3.2", "h200_sxm", "vllm", 1, 8);
    close(v32.prefill_ms(2, 1000, 0).unwrap(), 232.77201636697106);
    close(v32.prefill_ms(1, 20000, 0).unwrap(), 2478.3511071573566);
    close(v32.decode_ms(16, 1100).unwrap(), 22.564069851685552);
    close(v32.forward_pass_time_ms(&[MIXED]).unwrap(), 369.68064237444855);
    let v32s = layout("deepseek-ai/DeepSeek-V3.2", "h200_sxm", "sglang", 8, 1);
    close(v32s.prefill_ms(2, 3000, 500).unwrap(), 430.88098200136835);
    close(v32s.decode_ms(33, 5000).unwrap(), 26.467282360630154);
    close(v32s.forward_pass_time_ms(&[MIXED]).unwrap(), 145.7078626782321);
    let glm = layout("zai-org/GLM-5.2-FP8", "b200_sxm", "vllm", 1, 8);
    close(glm.prefill_ms(2, 1000, 0).unwrap(), 89.6195867711037);
    close(glm.decode_ms(16, 1100).unwrap(), 18.031384664121706);
    close(glm.forward_pass_time_ms(&[MIXED]).unwrap(), 118.0688420470675);
    let v32f4 = layout("nvidia/DeepSeek-V3.2-NVFP4", "b200_sxm", "vllm", 1, 8);
    close(v32f4.prefill_ms(2, 1000, 0).unwrap(), 69.16813178286377);
    close(v32f4.decode_ms(16, 1100).unwrap(), 14.02885746702461);
    let glmf4 = layout("nvidia/GLM-5.2-NVFP4", "b200_sxm", "sglang", 1, 8);
    close(glmf4.prefill_ms(2, 1000, 0).unwrap(), 77.96372606214918);
    close(glmf4.decode_ms(16, 1100).unwrap(), 10.816792758501325);
    use servesim_perf::memory::kv_capacity;
    for (e, block, want) in [(&v32, 64, 12094u64), (&v32f4, 64, 36890), (&glmf4, 1, 1657743)] {
        let got = kv_capacity(e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{}: {got:?}", e.model.name);
    }
}

/// An explicit `attention_backend` times the lanes the reference maps it to, and fails as the
/// reference does when the tables hold none of them (probed on Dynamo 1.6.1 + aisimulate:
/// `_normalize_mocker_config` raises UnsupportedAttentionBackendError for all three below).
#[test]
fn attention_backend_overrides_need_their_lanes() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping");
        return;
    }
    let with = |backend: &str, ab: &str| {
        let cfg = json!({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": backend,
                         "worker_type": "aggregated", "attention_backend": ab});
        estimator(&AisConfig::from_json("config", &cfg).unwrap()).map(|_| ()).map_err(|e| e.message)
    };
    let e = with("vllm", "flashinfer").unwrap_err();
    assert!(e.contains("has no context attention measurements") && e.contains("vllm_flash_attn_fa3"), "{e}");
    let e = with("vllm", "triton").unwrap_err();
    assert!(e.contains("expected at least one stored lane of [\"vllm_triton_attn\"]"), "{e}");
    let e = with("vllm", "fa3").unwrap_err();
    assert!(
        e.contains("not supported on backend \"vllm\"; supported values: [\"flashinfer\", \"triton\", \"default\"]"),
        "{e}"
    );
    with("vllm", "default").unwrap();
    with("sglang", "fa3").unwrap();
    let e = with("sglang", "flashinfer").unwrap_err();
    assert!(e.contains("available lanes: [\"fa3\", \"triton\"]"), "{e}");
    // DSA reads module tables without lanes, and the reference ignores the pin there: GLM-5-FP8
    // at TP 8 / EP 8 on H200 SGLang gives mean TTFT 208.29510899999997 ms and ITL
    // 15.645335841269821 ms with and without `attention_backend: flashinfer` (aisimulate_predict.py,
    // 20 requests of 1024 / 64 at concurrency 4).
    let glm = |pin: Option<&str>| {
        let mut cfg = json!({"model": "zai-org/GLM-5-FP8", "system": "h200_sxm", "backend": "sglang", "tp": 8,
                             "moe_tp_size": 1, "moe_ep_size": 8});
        if let Some(p) = pin {
            cfg["attention_backend"] = json!(p);
        }
        estimator(&AisConfig::from_json("config", &cfg).unwrap()).unwrap()
    };
    let (pinned, plain) = (glm(Some("flashinfer")), glm(None));
    assert_eq!(pinned.prefill_ms(2, 1000, 0).unwrap(), plain.prefill_ms(2, 1000, 0).unwrap());
    assert_eq!(pinned.decode_ms(16, 1100).unwrap(), plain.decode_ms(16, 1100).unwrap());
}

/// The wide expert-parallel knobs are refused by key, saying what servesim would need; the EPLB
/// knobs are read (they time nothing on the fused block, `eplb.rs`).
#[test]
fn wide_ep_is_refused_with_what_is_missing() {
    for (k, v) in [("enable_eplb", json!(true)), ("wideep_num_slots", json!(288))] {
        let mut cfg = json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 8});
        cfg[k] = v;
        AisConfig::from_json("config", &cfg).unwrap();
    }
    let mut cfg = json!({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 8});
    cfg["moe_kernel_source"] = json!("deepgemm");
    let e = AisConfig::from_json("config", &cfg).unwrap_err().message;
    assert!(
        e.contains("moe_kernel_source")
            && e.contains("all-to-all dispatch and combine")
            && e.contains("MLA and DSA models on SGLang"),
        "{e}"
    );
}

/// `moe_backend`: the reference's value and backend checks in its words, its MoE-model check,
/// and the two families whose builders read it; elsewhere it is accepted and times the default
/// graph (see `eplb.rs` for the probes).
#[test]
fn moe_backend_is_checked_as_the_reference_checks_it() {
    let refusal = |model: &str, backend: &str, value: &str, tp: u32| {
        let cfg = json!({"model": model, "system": "h200_sxm", "backend": backend, "tp": tp,
                         "moe_tp_size": tp, "moe_ep_size": 1, "moe_backend": value});
        match AisConfig::from_json("config", &cfg) {
            Err(e) => Some(e.message),
            Ok(c) => estimator(&c).err().map(|e| e.message),
        }
    };
    let e = refusal("Qwen/Qwen3-30B-A3B", "sglang", "deepep", 1).unwrap();
    assert!(
        e.contains("config.moe_backend: unsupported moe_backend \"deepep\"; expected default, deepep_moe or megamoe"),
        "{e}"
    );
    let e = refusal("Qwen/Qwen3-30B-A3B", "vllm", "deepep_moe", 1).unwrap();
    assert!(e.contains("a moe_backend override requires backend=sglang, got vllm"), "{e}");
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the moe_backend model checks");
        return;
    }
    let e = refusal("Qwen/Qwen3-8B", "sglang", "deepep_moe", 1).unwrap();
    assert!(e.contains("moe_backend: the model has no routed experts"), "{e}");
    let e = refusal("Qwen/Qwen3.5-35B-A3B", "sglang", "deepep_moe", 1).unwrap();
    assert!(e.contains("moe_backend: deepep_moe: Qwen3.5's DeepEP branch"), "{e}");
    let e = refusal("Qwen/Qwen3.5-35B-A3B", "sglang", "megamoe", 1).unwrap();
    assert!(e.contains("Qwen3.5 does not model moe_backend='megamoe'"), "{e}");
    for value in ["default", "deepep_moe", "megamoe"] {
        assert_eq!(refusal("Qwen/Qwen3-30B-A3B", "sglang", value, 1), None, "{value}");
        assert_eq!(refusal("deepseek-ai/DeepSeek-V3", "sglang", value, 8), None, "{value}");
    }
}

/// Gemma 4 (GEMMA4MIX): sliding-window (head 256, window 1024) and global (head 512, K = V)
/// blocks, the dense MLP beside 128 routed experts, window-capped KV; the NVFP4 release keeps
/// attention and MLP in bf16 (`scripts/ais_goldens.py`).
#[test]
fn gemma4_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the Gemma 4 goldens");
        return;
    }
    let layout = |model: &str, system: &str, backend: &str, tp: u32, moe_tp: u32, moe_ep: u32| {
        est_with(json!({"model": model, "system": system, "backend": backend, "tp": tp,
                        "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
    };
    let v = layout("google/gemma-4-26B-A4B", "h200_sxm", "vllm", 1, 1, 1);
    close(v.prefill_ms(4, 1024, 0).unwrap(), 58.15952163977681);
    close(v.prefill_ms(1, 20000, 0).unwrap(), 341.0273107579514);
    close(v.decode_ms(16, 1100).unwrap(), 9.975570423466284);
    close(v.decode_ms(7, 131072).unwrap(), 12.689229334017075);
    let s = layout("google/gemma-4-26B-A4B", "h200_sxm", "sglang", 2, 1, 2);
    close(s.prefill_ms(2, 3000, 500).unwrap(), 110.10209368460102);
    close(s.decode_ms(33, 5000).unwrap(), 9.511363187582432);
    close(s.forward_pass_time_ms(&[MIXED]).unwrap(), 54.1897998135169);
    let f4 = layout("nvidia/Gemma-4-26B-A4B-NVFP4", "b200_sxm", "vllm", 2, 2, 1);
    close(f4.prefill_ms(2, 1000, 0).unwrap(), 18.624333753203405);
    close(f4.decode_ms(16, 1100).unwrap(), 5.316697904280894);
    use servesim_perf::memory::kv_capacity;
    for (e, block, want) in [(&v, 64, 59611u64), (&s, 1, 9972778), (&f4, 64, 431661)] {
        let got = kv_capacity(e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{}: {got:?}", e.model.name);
    }
}

/// MiniMax-M3 (the reference's MINIMAXM3): the MSA block from its own module tables (exact grid,
/// blended, and past the data against the roofline), DSA's graph around it, a mixed pass (the MSA
/// block timed apart at the prefill shape) and the KV capacity
/// (`$AISIM_REF_VENV/bin/python scripts/ais_goldens.py`).
#[test]
fn msa_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the MSA goldens");
        return;
    }
    let m3 = est_with(json!({"model": "MiniMaxAI/MiniMax-M3", "system": "h200_sxm", "backend": "vllm", "tp": 8,
                             "moe_tp_size": 1, "moe_ep_size": 8}));
    close(m3.prefill_ms(2, 1000, 0).unwrap(), 80.06171950118781);
    close(m3.prefill_ms(1, 20000, 0).unwrap(), 664.798853285825);
    close(m3.prefill_ms(2, 3000, 500).unwrap(), 181.65829471916618);
    close(m3.decode_ms(16, 1100).unwrap(), 18.888847155041375);
    close(m3.decode_ms(7, 131072).unwrap(), 18.44491575938163);
    close(m3.forward_pass_time_ms(&[MIXED]).unwrap(), 89.7110259971718);
    let got = servesim_perf::memory::kv_capacity(&m3, None, 8192, 64, 0.0).unwrap();
    assert_eq!(got.blocks, 9659, "{got:?}");
}

/// nvidia/MiniMax-M3-NVFP4, a ModelOpt MIXED_PRECISION checkpoint: its MXFP8 attention, dense-MLP
/// and shared-expert projections run as fp8_block GEMMs (the MSA module's `gemm_type` too), its
/// NVFP4 routed experts as nvfp4, with bf16 KV and attention (no KV declaration). Numbers from
/// `$AISIM_REF_VENV/bin/python scripts/ais_goldens.py --msa-nvfp4`. SGLang 0.5.14 has no MSA
/// table on B200 (the reference cannot build its op-level model either): refused by name.
#[test]
fn msa_nvfp4_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the MiniMax-M3-NVFP4 goldens");
        return;
    }
    let layout = |system: &str, backend: &str, moe_tp: u32, moe_ep: u32| {
        est_with(json!({"model": "nvidia/MiniMax-M3-NVFP4", "system": system, "backend": backend, "tp": 8,
                        "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
    };
    let ep = layout("b200_sxm", "vllm", 1, 8);
    let q = &ep.model.quant;
    use servesim_perf::db::Dtype;
    assert_eq!((q.gemm, q.moe, q.kv, q.fmha), (Dtype::Fp8Block, Dtype::Nvfp4, Dtype::Bfloat16, Dtype::Bfloat16));
    close(ep.prefill_ms(2, 1000, 0).unwrap(), 41.82941587559764);
    close(ep.prefill_ms(1, 20000, 0).unwrap(), 254.31269408658193);
    close(ep.prefill_ms(2, 3000, 500).unwrap(), 81.95401816093481);
    close(ep.decode_ms(16, 1100).unwrap(), 13.49771829884386);
    close(ep.decode_ms(7, 131072).unwrap(), 12.617566790871168);
    let prefill_rank = RankMetrics {
        num_prefill_requests: 3,
        sum_prefill_tokens: 2000,
        sum_prefill_kv_tokens: 3000,
        ..Default::default()
    };
    let decode_rank = RankMetrics { num_decode_requests: 40, sum_decode_kv_tokens: 40 * 3000, ..Default::default() };
    close(ep.forward_pass_time_ms(&[prefill_rank]).unwrap(), 43.13887773152646);
    close(ep.forward_pass_time_ms(&[decode_rank]).unwrap(), 17.424209524764894);
    close(ep.forward_pass_time_ms(&[MIXED]).unwrap(), 49.1614499680412);
    let tp = layout("gb200", "vllm", 8, 1);
    close(tp.prefill_ms(4, 777, 0).unwrap(), 64.64989788129999);
    close(tp.prefill_ms(1, 8192, 0).unwrap(), 138.38860148088645);
    close(tp.decode_ms(64, 4097).unwrap(), 18.894624004594498);
    close(tp.decode_ms(256, 8000).unwrap(), 27.656371981859564);
    let got = servesim_perf::memory::kv_capacity(&ep, None, 8192, 64, 0.0).unwrap();
    assert_eq!(got.blocks, 68789, "{got:?}");
    let e = layout("b200_sxm", "sglang", 1, 8).prefill_ms(1, 1024, 0).unwrap_err().to_string();
    assert!(
        e.contains(
            "no context MSA module data for MiniMaxM3ForCausalLM/bfloat16/bfloat16/fp8_block on b200_sxm / sglang"
        ) && e.contains("have: none; no msa_context_module_perf.parquet file is installed for this backend version"),
        "{e}"
    );
}

/// Local / global attention with MoE and dense layers (the reference's HYBRIDMOE family):
/// Llama-4 Scout (every layer MoE, chunked local attention of 8192 tokens), Maverick (MoE and
/// dense layers alternating), MiMo-V2-Flash (fp8 block, local layers with their own widths and a
/// 128-token window). Reference numbers: scripts/ais_goldens.py.
#[test]
fn hybrid_moe_goldens() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the hybrid MoE goldens");
        return;
    }
    let layout = |model: &str, backend: &str, tp: u32, moe_tp: u32, moe_ep: u32| {
        est_with(json!({"model": model, "system": "h200_sxm", "backend": backend, "tp": tp,
                        "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
    };
    let scout = layout("meta-llama/Llama-4-Scout-17B-16E-Instruct", "vllm", 2, 1, 2);
    close(scout.prefill_ms(2, 3000, 0).unwrap(), 175.13845638100116);
    close(scout.prefill_ms(1, 20000, 0).unwrap(), 633.9783137294174);
    close(scout.decode_ms(16, 1100).unwrap(), 18.766322922984106);
    close(scout.forward_pass_time_ms(&[MIXED]).unwrap(), 79.26515619274849);
    let maverick = layout("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "sglang", 8, 1, 8);
    close(maverick.prefill_ms(2, 3000, 500).unwrap(), 86.88877999622379);
    close(maverick.decode_ms(33, 5000).unwrap(), 18.910781856890697);
    let mimo = layout("XiaomiMiMo/MiMo-V2-Flash", "trtllm", 4, 4, 1);
    close(mimo.prefill_ms(4, 777, 0).unwrap(), 106.93949463257287);
    close(mimo.decode_ms(64, 4097).unwrap(), 23.329539440605338);
    let mimo_vllm = layout("XiaomiMiMo/MiMo-V2-Flash", "vllm", 4, 4, 1);
    use servesim_perf::memory::kv_capacity;
    for (e, block, want) in [(&scout, 64, 4588u64), (&maverick, 1, 1124628), (&mimo_vllm, 64, 44581)] {
        let got = kv_capacity(e, None, 8192, block, 0.0).unwrap();
        assert_eq!(got.blocks, want, "{}: {got:?}", e.model.name);
    }
}
