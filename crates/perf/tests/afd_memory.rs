//! The AFD pools' per-GPU memory (`servesim_perf::afd::{prefill,decode}_memory`) and the
//! out-of-memory check against aisimulate 0.13's candidate build, recorded with
//!     $AISIM_REF_VENV/bin/python scripts/afd_memory_goldens.py
//! (the attention and FFN pools' totals in GiB per phase, the worst over the phases rounded as
//! the reference's `(a)memory` / `(f)memory`, and whether the run is out of memory). The cases
//! cover a dense and an MoE model, vLLM, SGLang and TRT-LLM, boundary ops on either side, and
//! the three ways to fail: the attention pool's total over the GPU, under it but over vLLM's KV
//! budget (fraction of the whole GPU), and TRT-LLM's (fraction of what is left).

mod common;

use common::{data_available, est_with};
use serde_json::json;
use servesim_perf::afd::{decode_memory, out_of_memory, prefill_memory, Pools, Shape};

struct Case {
    model: &'static str,
    backend: &'static str,
    /// isl, osl, max_seq_len (the candidate's context length).
    io: (u32, u32, u32),
    /// n_a_nodes, n_f_nodes, tp_a, f_moe_ep_size, a_batch_size, num_microbatches.
    shape: [u32; 6],
    boundary_on_attn: bool,
    /// Attention and FFN pool totals, GiB.
    prefill: [f64; 2],
    decode: [f64; 2],
    /// The reference's `(a)memory` and `(f)memory`.
    memory: [f64; 2],
    oom: bool,
}

const CASES: [Case; 7] = [
    Case {
        model: "Qwen/Qwen3-8B",
        backend: "vllm",
        io: (300, 20, 40960),
        shape: [2, 1, 1, 1, 16, 12],
        boundary_on_attn: true,
        prefill: [19.94921875, 5.5146484375],
        decode: [143.69921875, 5.216796875],
        memory: [143.7, 5.51],
        oom: true,
    },
    Case {
        model: "Qwen/Qwen3-8B",
        backend: "vllm",
        io: (300, 20, 40960),
        shape: [1, 2, 4, 1, 16, 6],
        boundary_on_attn: true,
        prefill: [9.45263671875, 4.58428955078125],
        decode: [30.54638671875, 4.583984375],
        memory: [30.55, 4.58],
        oom: false,
    },
    Case {
        model: "Qwen/Qwen3-8B",
        backend: "vllm",
        io: (300, 20, 40960),
        shape: [1, 1, 1, 1, 22, 11],
        boundary_on_attn: true,
        prefill: [19.94921875, 5.33154296875],
        decode: [132.44921875, 5.216796875],
        memory: [132.45, 5.33],
        oom: true,
    },
    Case {
        model: "Qwen/Qwen3-8B",
        backend: "vllm",
        io: (3000, 200, 8192),
        shape: [1, 1, 2, 1, 64, 3],
        boundary_on_attn: false,
        prefill: [21.46783447265625, 15.3641357421875],
        decode: [43.01318359375, 5.3616943359375],
        memory: [43.01, 15.36],
        oom: false,
    },
    Case {
        model: "Qwen/Qwen3-30B-A3B",
        backend: "vllm",
        io: (256, 8, 40960),
        shape: [1, 1, 2, 8, 4, 2],
        boundary_on_attn: true,
        prefill: [8.785888671875, 10.8125],
        decode: [12.82568359375, 10.724609375],
        memory: [12.83, 10.81],
        oom: false,
    },
    Case {
        model: "Qwen/Qwen3-30B-A3B",
        backend: "sglang",
        io: (2048, 64, 32768),
        shape: [1, 2, 1, 2, 48, 4],
        boundary_on_attn: true,
        prefill: [48.504589843750004, 30.406249999999996],
        decode: [151.14775390625, 8.08232421875],
        memory: [151.15, 30.41],
        oom: true,
    },
    Case {
        model: "Qwen/Qwen3-30B-A3B",
        backend: "trtllm",
        io: (1024, 128, 40960),
        shape: [1, 1, 1, 1, 32, 2],
        boundary_on_attn: true,
        prefill: [68.51708984375, 20.65625],
        decode: [126.4150390625, 10.724609375],
        memory: [126.42, 20.66],
        oom: true,
    },
];

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs(), "{what}: {got}, reference {want}");
}

#[test]
fn afd_pool_memory_matches_the_reference() {
    if !data_available("h200_sxm") {
        eprintln!("NOTICE: AIS data not installed (set SERVESIM_AIS_SYSTEMS); skipping the AFD memory goldens");
        return;
    }
    for c in &CASES {
        let [n_a_nodes, n_f_nodes, tp_a, ep, a_batch_size, num_microbatches] = c.shape;
        let ffn_tp = n_f_nodes * 8;
        let est = |tp: u32, moe_tp: u32, moe_ep: u32| {
            est_with(json!({"model": c.model, "system": "h200_sxm", "backend": c.backend, "tp": tp,
                            "moe_tp_size": moe_tp, "moe_ep_size": moe_ep}))
        };
        let (attention, ffn) = (est(tp_a, tp_a, 1), est(ffn_tp, ffn_tp / ep, ep));
        let pools = Pools { attention: &attention, ffn: &ffn };
        let shape = Shape {
            n_a_nodes,
            n_f_nodes,
            gpus_per_node: 8,
            tp_a,
            f_moe_ep_size: ep,
            a_batch_size,
            num_microbatches,
            boundary_on_attn: c.boundary_on_attn,
        };
        let (isl, osl, max_seq_len) = c.io;
        let what = format!("{} {} {:?}", c.model, c.backend, c.shape);
        let p = prefill_memory(&pools, &shape, isl, Some(max_seq_len)).unwrap();
        let d = decode_memory(&pools, &shape, isl, osl, Some(max_seq_len)).unwrap();
        close(p.attention.total(), c.prefill[0], &format!("{what}: prefill attention"));
        close(p.ffn.total(), c.prefill[1], &format!("{what}: prefill FFN"));
        close(d.attention.total(), c.decode[0], &format!("{what}: decode attention"));
        close(d.ffn.total(), c.decode[1], &format!("{what}: decode FFN"));
        let round = |x: f64| (x * 100.0).round() / 100.0;
        assert_eq!(round(p.attention.total().max(d.attention.total())), c.memory[0], "{what}: (a)memory");
        assert_eq!(round(p.ffn.total().max(d.ffn.total())), c.memory[1], "{what}: (f)memory");
        assert_eq!(out_of_memory(&pools, &[p, d]), c.oom, "{what}: out of memory");
    }
}
