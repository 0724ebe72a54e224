//! The whole pipeline on a tiny `systems/` tree the test writes itself (system YAML, version
//! slots, parquet tables written with the `parquet` crate, a model config), so it runs anywhere.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use serde_json::{json, Value};
use servesim_perf::{estimator, AisConfig};

enum Col {
    I(Vec<i64>),
    F(Vec<f64>),
    S(Vec<&'static str>),
}

fn write_table(path: &Path, cols: &[(&str, Col)]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let fields: Vec<String> = cols
        .iter()
        .map(|(n, c)| match c {
            Col::I(_) => format!("required int64 {n};"),
            Col::F(_) => format!("required double {n};"),
            Col::S(_) => format!("required binary {n} (UTF8);"),
        })
        .collect();
    let schema = Arc::new(parse_message_type(&format!("message t {{ {} }}", fields.join(" "))).unwrap());
    let mut w =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(WriterProperties::builder().build()))
            .unwrap();
    let mut g = w.next_row_group().unwrap();
    for (_, c) in cols {
        let mut cw = g.next_column().unwrap().unwrap();
        match c {
            Col::I(v) => cw.typed::<Int64Type>().write_batch(v, None, None).unwrap(),
            Col::F(v) => cw.typed::<DoubleType>().write_batch(v, None, None).unwrap(),
            Col::S(v) => cw
                .typed::<ByteArrayType>()
                .write_batch(&v.iter().map(|s| ByteArray::from(*s)).collect::<Vec<_>>(), None, None)
                .unwrap(),
        };
        cw.close().unwrap();
    }
    g.close().unwrap();
    w.close().unwrap();
}

const SPEC: &str = "data_dir: data/toy\ngpu:\n  mem_bw: 1000000000000\n  mem_bw_empirical_scaling_factor: 0.5\n  mem_empirical_constant_latency: 0.000001\n  mem_capacity: 85899345920\n  bfloat16_tc_flops: 1000000000000000\n  sm_version: 90\nnode:\n  num_gpus_per_node: 8\n  inter_node_bw: 50000000000\n  intra_node_bw: 450000000000\n  p2p_latency: 0.00001\nmisc:\n  other_mem: 1000000000\n  nccl_mem:\n    1: 0\n    2: 100000000\n    4: 100000000\n";

/// Every table has utilisation 0.5 of its SOL (GEMM: 2mnk/flops; memory bound shapes aside),
/// so interpolation and holds reproduce closed forms.
fn toy_tree(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join("toy.yaml"), SPEC).unwrap();
    std::fs::write(
        root.join("query_versions.yaml"),
        "schema_version: 1\ndefaults:\n  vllm: {current: \"1.0\", previous: null}\n",
    )
    .unwrap();
    let d = root.join("data/toy");
    // GEMM: sites (n, k) in {64, 128}², m in {1, 16, 256}; latency = 2 × compute SOL (ms).
    let (mut m, mut n, mut k, mut lat) = (vec![], vec![], vec![], vec![]);
    for &nn in &[64i64, 128] {
        for &kk in &[64i64, 128] {
            for &mm in &[1i64, 16, 256] {
                m.push(mm);
                n.push(nn);
                k.push(kk);
                lat.push(
                    2.0 * (2.0 * (mm * nn * kk) as f64 / 1e15 * 1e3)
                        .max(2.0 * (mm * nn + mm * kk + nn * kk) as f64 / 1e12 * 1e3),
                );
            }
        }
    }
    let rows = m.len();
    write_table(
        &d.join("gemm/vllm/1.0/gemm_perf.parquet"),
        &[
            ("gemm_dtype", Col::S(vec!["bfloat16"; rows])),
            ("m", Col::I(m)),
            ("n", Col::I(n)),
            ("k", Col::I(k)),
            ("latency", Col::F(lat)),
        ],
    );
    // Attention: 4 heads, 1 KV head, head_dim 16; context isl {16, 64}, batch {1, 2}; decode KV {16, 64}.
    let mut ctx: (Vec<i64>, Vec<i64>, Vec<f64>) = (vec![], vec![], vec![]);
    for &s in &[16i64, 64] {
        for &b in &[1i64, 2] {
            ctx.0.push(b);
            ctx.1.push(s);
            ctx.2.push(0.001 * (b * s * s) as f64);
        }
    }
    let r = ctx.0.len();
    let common = |r: usize| {
        vec![
            ("num_heads", Col::I(vec![4; r])),
            ("num_key_value_heads", Col::I(vec![1; r])),
            ("head_dim", Col::I(vec![16; r])),
            ("attn_dtype", Col::S(vec!["bfloat16"; r])),
            ("kv_cache_dtype", Col::S(vec!["bfloat16"; r])),
        ]
    };
    let mut cols = vec![
        ("batch_size", Col::I(ctx.0)),
        ("isl", Col::I(ctx.1)),
        ("step", Col::I(vec![0; r])),
        ("latency", Col::F(ctx.2)),
    ];
    cols.extend(common(r));
    write_table(&d.join("attention/vllm/1.0/context_attention_perf.parquet"), &cols);
    let mut g: (Vec<i64>, Vec<i64>, Vec<f64>) = (vec![], vec![], vec![]);
    for &s in &[16i64, 64, 256] {
        for &b in &[1i64, 8] {
            g.0.push(b);
            g.1.push(s);
            g.2.push(0.01 + 1e-5 * (b * s) as f64);
        }
    }
    let r = g.0.len();
    let mut cols = vec![
        ("batch_size", Col::I(g.0)),
        ("isl", Col::I(vec![1; r])),
        ("step", Col::I(g.1.iter().map(|s| s - 1).collect())),
        ("latency", Col::F(g.2)),
    ];
    cols.extend(common(r));
    write_table(&d.join("attention/vllm/1.0/generation_attention_perf.parquet"), &cols);
    write_table(
        &d.join("comm/vllm/1.0/custom_allreduce_perf.parquet"),
        &[
            ("num_gpus", Col::I(vec![2, 2])),
            ("message_size", Col::I(vec![1024, 4096])),
            ("latency", Col::F(vec![0.01, 0.02])),
            ("backend", Col::S(vec!["vllm_graph", "vllm_graph"])),
        ],
    );
    // MoE: topk 2 of 64 experts, hidden 128, expert inter 64, at moe_tp × moe_ep = 1 × 2 over
    // tokens {16, 64, 256}; a second layout (2 × 1) with a single point.
    let moe_rows: Vec<(i64, i64, i64, f64)> =
        vec![(1, 2, 16, 0.010), (1, 2, 64, 0.020), (1, 2, 256, 0.050), (2, 1, 64, 0.030)];
    let r = moe_rows.len();
    write_table(
        &d.join("moe/vllm/1.0/moe_perf.parquet"),
        &[
            ("moe_dtype", Col::S(vec!["bfloat16"; r])),
            ("num_tokens", Col::I(moe_rows.iter().map(|x| x.2).collect())),
            ("hidden_size", Col::I(vec![128; r])),
            ("inter_size", Col::I(vec![64; r])),
            ("topk", Col::I(vec![2; r])),
            ("num_experts", Col::I(vec![64; r])),
            ("moe_tp_size", Col::I(moe_rows.iter().map(|x| x.0).collect())),
            ("moe_ep_size", Col::I(moe_rows.iter().map(|x| x.1).collect())),
            ("distribution", Col::S(vec!["uniform"; r])),
            ("latency", Col::F(moe_rows.iter().map(|x| x.3).collect())),
        ],
    );
    std::fs::create_dir_all(root.parent().unwrap().join("model_configs")).unwrap();
    std::fs::write(
        root.parent().unwrap().join("model_configs/toy--moe_config.json"),
        json!({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 16, "moe_intermediate_size": 64, "num_experts": 64, "num_experts_per_tok": 2,
               "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 1024})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        root.parent().unwrap().join("model_configs/toy--tiny_config.json"),
        json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
               "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 1024})
        .to_string(),
    )
    .unwrap();
}

#[test]
fn pipeline_on_synthetic_tables() {
    let dir = std::env::temp_dir().join(format!("servesim-perf-toy-{}", std::process::id()));
    let root = dir.join("systems");
    toy_tree(&root);
    let cfg = |tp: u32| {
        AisConfig::from_json(
            "config",
            &json!({"model": "toy/tiny", "system": "toy", "backend": "vllm", "tp": tp, "systems_paths": [root.display().to_string()]}),
        )
        .unwrap()
    };
    let e = estimator(&cfg(2)).unwrap();
    assert_eq!(e.db.version, "1.0");
    let ops = e.prefill_ops(1, 16, 0).unwrap();
    let get = |name: &str| ops.iter().find(|(n, _)| n == name).unwrap().1;
    // Memory op: bytes / (1e12 × 0.5) + 1 µs, in ms, × 2 layers. add_norm: 4h × 2 bytes per token.
    let mem = |bytes: f64| (bytes / 0.5e12 + 1e-6) * 1e3;
    assert!((get("context_add_norm_1") - 2.0 * mem(16.0 * 4.0 * 128.0 * 2.0)).abs() < 1e-12);
    // qkv GEMM: n = 8·16/2 + 2·16·1 = 96 (unknown site between 64 and 128), k = 128, m = 16: utilisation 0.5.
    let sol = |m: f64, n: f64, k: f64| (2.0 * m * n * k / 1e15 * 1e3).max(2.0 * (m * n + m * k + n * k) / 1e12 * 1e3);
    assert!((get("context_qkv_gemm") - 2.0 * 2.0 * sol(16.0, 96.0, 128.0)).abs() < 1e-9, "{}", get("context_qkv_gemm"));
    // Context attention exact point (4 heads per GPU, 1 KV head, s=16, b=1) plus 1.1 × fused extras.
    let (q, kv) = (4.0 * 16.0, 16.0);
    let extras = mem(q * 2.0 + kv * 2.0) * 2.0 + 2.0 * mem(kv * 2.0);
    assert!((get("context_attention") - 2.0 * (0.001 * 256.0 + 1.1 * extras)).abs() < 1e-9);
    // All-reduce: 16 tokens × 128 = 2048 elements, between 1024 and 4096.
    assert!((get("context_ar_1") - 2.0 * (0.01 + 0.01 * (1024.0 / 3072.0))).abs() < 1e-12);
    // Decode: 5 samples of KV length within ±10 % of 64, raw-linear in s: mean = table at ~64.
    let d = e.decode_ops(8, 64).unwrap();
    let attn = d.iter().find(|(n, _)| n == "generation_attention").unwrap().1;
    let samples: Vec<u32> = (0..5).map(|i| 57 + (70 - 57) * i / 4).collect();
    let table = |s: u32| (0.01 + 1e-5 * 8.0 * s as f64).max(0.0);
    let want: f64 = samples.iter().map(|&s| table(s)).sum::<f64>() / 5.0;
    assert!((attn - 2.0 * want).abs() < 1e-9, "{attn} vs {}", 2.0 * want);
    // Past the collected range: an error names the query, or a utilisation hold answers.
    assert!(e.prefill_ms(2, 1000, 0).is_ok());
    // tp = 4 has no all-reduce table: the reference scales the largest recorded fan-out (2) by
    // (n−1)/n · m/(m−1) · bw(m)/bw(n) = 3/4 · 2 · 1 = 1.5.
    let e4 = estimator(&cfg(4)).unwrap();
    let ops4 = e4.prefill_ops(1, 16, 0).unwrap();
    let ar4 = ops4.iter().find(|(n, _)| n == "context_ar_1").unwrap().1;
    assert!((ar4 - 2.0 * 1.5 * (0.01 + 0.01 * (1024.0 / 3072.0))).abs() < 1e-12, "{ar4}");
    // A model whose attention shape has no table: the error names the slice and the data.
    let err = AisConfig::from_json(
        "c",
        &json!({"model": "toy/tiny", "system": "toy", "backend": "vllm", "tp": 1,
        "kvcache_quant_mode": "fp8", "systems_paths": [root.display().to_string()]}),
    )
    .unwrap();
    let err = estimator(&err).unwrap().prefill_ms(1, 16, 0).unwrap_err().message;
    assert!(
        err.contains("no context attention data") && err.contains("kv=fp8") && err.contains("toy / vllm 1.0"),
        "{err}"
    );
    // Unknown keys are rejected by key path.
    let err = AisConfig::from_json(
        "engine.timing_model.config",
        &json!({"model": "m", "system": "s", "backend": "vllm", "tpp": 2}),
    )
    .unwrap_err();
    assert!(err.message.starts_with("engine.timing_model.config.tpp: unknown key"), "{}", err.message);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn moe_on_synthetic_tables() {
    let dir = std::env::temp_dir().join(format!("servesim-perf-toy-moe-{}", std::process::id()));
    let root = dir.join("systems");
    toy_tree(&root);
    let cfg = |extra: serde_json::Value| {
        let mut v = json!({"model": "toy/moe", "system": "toy", "backend": "vllm", "tp": 2, "systems_paths": [root.display().to_string()]});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        AisConfig::from_json("config", &v).unwrap()
    };
    let e = estimator(&cfg(json!({"moe_tp_size": 1, "moe_ep_size": 2}))).unwrap();
    let names = |ops: &[(String, f64)]| ops.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let at = |ops: &[(String, f64)], name: &str| ops.iter().find(|(n, _)| n == name).unwrap().1;
    // The MoE block replaces the FFN and its all-reduces; the context phase has no logits GEMM.
    let ops = e.prefill_ops(1, 64, 0).unwrap();
    assert_eq!(
        names(&ops),
        [
            "context_embedding",
            "context_add_norm_1",
            "context_qkv_gemm",
            "context_attention",
            "context_proj_gemm",
            "context_add_norm_2",
            "context_router_gemm",
            "context_moe_pre_dispatch",
            "context_moe",
            "context_moe_post_dispatch",
            "context_embedding_ar",
            "context_p2p"
        ]
    );
    assert!(names(&e.decode_ops(1, 64).unwrap()).contains(&"generation_logits_gemm".to_string()));
    // Exact point (64 tokens) × 2 layers; the distribution falls back to uniform.
    assert!((at(&ops, "context_moe") - 2.0 * 0.020).abs() < 1e-12);
    // Dispatch and combine: the custom all-reduce over moe_tp × moe_ep = 2 GPUs, 64 × 128
    // elements = 8192, past the 4096 point: utilisation hold ∝ size.
    assert!((at(&ops, "context_moe_pre_dispatch") - 2.0 * 0.02 * 2.0).abs() < 1e-12);
    assert_eq!(at(&ops, "context_moe_pre_dispatch"), at(&ops, "context_moe_post_dispatch"));
    // Router GEMM: n = experts = 64, k = 128, bf16 (a collected site).
    let sol_g = |m: f64, n: f64, k: f64| (2.0 * m * n * k / 1e15 * 1e3).max(2.0 * (m * n + m * k + n * k) / 1e12 * 1e3);
    assert!((at(&ops, "context_router_gemm") - 2.0 * 2.0 * sol_g(64.0, 64.0, 128.0)).abs() < 1e-9);
    // Inside the curve: linear in tokens (16 → 64 at 40 tokens).
    let moe40 = at(&e.prefill_ops(1, 40, 0).unwrap(), "context_moe");
    assert!((moe40 - 2.0 * (0.010 + 0.010 * 24.0 / 48.0)).abs() < 1e-12, "{moe40}");
    // Past the curve: the 256-token point's utilisation against the MoE roofline.
    let sol_moe = |t: u64| {
        let total = t * 2;
        let ops = total * 128 * 64 * 3 * 2 / 2;
        let mem = total / 2 * 128 * 2 + total / 2 * 64 * 3 + 128 * 64 * 3 * (64u64 / 2).min(total / 2);
        (ops as f64 / 1e15 * 1e3).max(mem as f64 * 2.0 / 1e12 * 1e3)
    };
    let moe1k = at(&e.prefill_ops(1, 1024, 0).unwrap(), "context_moe");
    assert!((moe1k - 2.0 * 0.050 * sol_moe(1024) / sol_moe(256)).abs() < 1e-12, "{moe1k}");
    // KV capacity counts the expert weights, split over the experts' GPUs.
    let cap = servesim_perf::memory::kv_capacity(&e, None, 8192, 16, 0.0).unwrap();
    let experts = (128.0 * 64.0 * 64.0 * 2.0 * 3.0 / 2.0f64).floor() * 2.0;
    let attn_and_router = 2.0 * (2.0 * (96.0 * 128.0 + 128.0 * 64.0 + 64.0 * 128.0)) + 256.0 / 2.0 * 128.0 * 2.0;
    assert!((cap.weights_bytes - (experts + attn_and_router)).abs() < 1.0, "{cap:?}");
    // A single-point curve cannot answer below its point.
    let single = estimator(&cfg(json!({"moe_tp_size": 2, "moe_ep_size": 1}))).unwrap();
    let err = single.prefill_ms(1, 16, 0).unwrap_err().message;
    assert!(err.contains("only one measured token count (64)"), "{err}");
    // Widths must cover tp × attention_dp; unset ones default to 1, as in the reference.
    let err = estimator(&cfg(json!({}))).unwrap_err().message;
    assert!(err.contains("must equal tp × attention_dp (2 × 1)"), "{err}");
    // A layout the table does not hold names the ones it does.
    let wide = estimator(&cfg(json!({"tp": 4, "moe_tp_size": 1, "moe_ep_size": 4}))).unwrap();
    let err = wide.prefill_ms(1, 16, 0).unwrap_err().message;
    assert!(
        err.contains("at moe_tp=1 × moe_ep=4 (uniform)")
            && err.contains("collected moe_tp × moe_ep for this shape: 1×2, 2×1"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// An ngram verify pass of `w` tokens per request: every op but decode attention sees the
/// `w × batch` token batch (as plain decode of that many requests would); attention reads each
/// request's KV once, so it is priced at the request batch.
#[test]
fn ngram_verify_pass_on_synthetic_tables() {
    let dir = std::env::temp_dir().join(format!("servesim-perf-toy-ngram-{}", std::process::id()));
    let root = dir.join("systems");
    toy_tree(&root);
    let cfg = |extra: Value| {
        let mut v = json!({"model": "toy/tiny", "system": "toy", "backend": "vllm", "tp": 2,
                           "systems_paths": [root.display().to_string()]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        AisConfig::from_json("config", &v).unwrap()
    };
    let plain = estimator(&cfg(json!({}))).unwrap();
    let ngram =
        estimator(&cfg(json!({"speculation": {"kind": "ngram", "params": {"num_speculative_tokens": 3}}}))).unwrap();
    let (verify, wide, narrow) =
        (ngram.decode_ops(2, 64).unwrap(), plain.decode_ops(8, 64).unwrap(), plain.decode_ops(2, 64).unwrap());
    assert_eq!(verify.len(), wide.len());
    for (((name, v), (_, w)), (_, n)) in verify.iter().zip(&wide).zip(&narrow) {
        let want = if name == "generation_attention" { n } else { w };
        assert_eq!(v, want, "{name}");
    }
    assert!(ngram.decode_ms(2, 64).unwrap() > plain.decode_ms(2, 64).unwrap());
    std::fs::remove_dir_all(&dir).ok();
}
