#!/usr/bin/env python3
"""Print the reference's per-GPU HBM estimate of AFD topologies (the attention pool's and the
FFN pool's memory in GiB, per phase and the worst of both, and whether each pool runs out of
memory), as aisimulate 0.13's candidate build computes it (aisimulate.sweeper.afd_measure with
max_seq_len = the candidate's context_length). The numbers are read from the run's summary
before afd_measure turns an out-of-memory run into AFDInfeasible; the result dict's
`(a)memory` / `(f)memory` are the same totals rounded to two decimals.

    $AISIM_REF_VENV/bin/python scripts/afd_memory_goldens.py

crates/perf/tests/afd_memory.rs holds its output.
"""
import json
import warnings

warnings.filterwarnings("ignore")

from aisimulate.sdk import inference_session
from aisimulate.sweeper.afd_measure import measure_afd_layer_times
from aisimulate.sweeper.afd_parallel import AFDInfeasible, AFDTopology

# (model, system, backend, isl, osl, max_seq_len, topology keys)
CASES = [
    ("Qwen/Qwen3-8B", "h200_sxm", "vllm", 300, 20, 40960,
     dict(n_a_nodes=2, n_f_nodes=1, tp_a=1, a_batch_size=16, num_microbatches=12)),
    ("Qwen/Qwen3-8B", "h200_sxm", "vllm", 300, 20, 40960,
     dict(n_a_nodes=1, n_f_nodes=2, tp_a=4, a_batch_size=16, num_microbatches=6)),
    # Under the GPU's 141 GiB in total, but over vLLM 0.24's KV budget (0.92 x 0.98 of the GPU).
    ("Qwen/Qwen3-8B", "h200_sxm", "vllm", 300, 20, 40960,
     dict(n_a_nodes=1, n_f_nodes=1, tp_a=1, a_batch_size=22, num_microbatches=11)),
    ("Qwen/Qwen3-8B", "h200_sxm", "vllm", 3000, 200, 8192,
     dict(n_a_nodes=1, n_f_nodes=1, tp_a=2, a_batch_size=64, num_microbatches=3, boundary_on_attn=False)),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "vllm", 256, 8, 40960,
     dict(n_a_nodes=1, n_f_nodes=1, tp_a=2, a_batch_size=4, f_moe_ep_size=8, num_microbatches=2, is_moe=True, num_experts=128)),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "sglang", 2048, 64, 32768,
     dict(n_a_nodes=1, n_f_nodes=2, tp_a=1, a_batch_size=48, f_moe_ep_size=2, num_microbatches=4, is_moe=True, num_experts=128)),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "trtllm", 1024, 128, 40960,
     dict(n_a_nodes=1, n_f_nodes=1, tp_a=1, a_batch_size=32, f_moe_ep_size=1, num_microbatches=2, is_moe=True, num_experts=128)),
]

captured = {}
_run_afd = inference_session.AFDInferenceSession.run_afd


def _capture(self, *args, **kwargs):
    summary = _run_afd(self, *args, **kwargs)
    captured["memory"] = summary.get_per_ops_data()["memory"]
    captured["result"] = summary.get_result_dict()
    captured["oom"] = summary.check_oom()
    return summary


inference_session.AFDInferenceSession.run_afd = _capture


def main():
    rows = []
    for model, system, backend, isl, osl, max_seq_len, keys in CASES:
        topology = AFDTopology(gpus_per_node=8, phase="both", combined_with_pd=False, pipeline_model="conservative",
                               **keys)
        captured.clear()
        try:
            measure_afd_layer_times(model_path=model, system_name=system, backend_name=backend, isl=isl, osl=osl,
                                    topology=topology, max_seq_len=max_seq_len)
            failure = None
        except AFDInfeasible as exc:
            failure = str(exc)
        m, r = captured["memory"], captured["result"]
        rows.append({
            "case": [model, system, backend, isl, osl, max_seq_len, keys],
            "a_gib": m["a_worker"]["total"], "f_gib": m["f_worker"]["total"],
            "a_memory": r["(a)memory"], "f_memory": r["(f)memory"],
            "phases": {p: {pool: m[p][pool] for pool in ("a_worker", "f_worker")} for p in ("prefill", "decode")},
            "a_is_oom": r["(a)is_oom"], "f_is_oom": r["(f)is_oom"], "oom": captured["oom"], "failure": failure,
        })
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
