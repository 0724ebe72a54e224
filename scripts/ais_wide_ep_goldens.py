#!/usr/bin/env python3
"""Print the reference numbers behind crates/perf/tests/wide_ep.rs (large-EP MoE graph).

Run with the aisimulate reference venv's python (aisimulate 0.13.0.dev202610270000000085):

    $AISIM_REF_VENV/bin/python scripts/ais_wide_ep_goldens.py

aisimulate 0.13 builds the large-EP graph only when its Task enumerator sets
`ModelConfig.moe_comm_backend` (the forward-pass config that `predict -c` / `recommend -c` and
Dynamo build from never does). This script sets it as the enumerator would for the context
phase (`{"context": "deepep_ht"}`, `num_gpus_per_node` from the system), applies the
checkpoint's quant defaults (`_apply_model_quant_defaults`), builds the model with `get_model`
and prints the per-op context latencies of the backend's static breakdown
(`_run_static_breakdown(model, db, RuntimeConfig(batch, isl, prefix), "static_ctx")`, the path
the legacy CLI sums), one JSON line per (case, query), plus the error of each refused case.
"""
import json
import logging

logging.disable(logging.WARNING)

from aisimulate.sdk.backends.factory import get_backend  # noqa: E402
from aisimulate.sdk.config import ModelConfig, RuntimeConfig  # noqa: E402
from aisimulate.sdk.models import _get_model_info, get_model  # noqa: E402
from aisimulate.sdk.models.helpers import _apply_model_quant_defaults  # noqa: E402
from aisimulate.sdk.perf_database import get_database, load_system_spec  # noqa: E402

CASES = [
    # (model, system, backend, version, tp, attention dp, moe_ep, comm, enable_eplb, wideep_num_slots)
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 1, 8, 8, {"context": "deepep_ht"}, False, None),
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 2, 4, 8, {"context": "deepep_ht"}, False, 288),
    ("MiniMaxAI/MiniMax-M2.7", "b200_sxm", "vllm", "0.24.0", 1, 8, 8, {"context": "deepep_ht"}, False, None),
    # Two nodes: the node-wide EP8 curve stands in for EP16.
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 1, 16, 16, {"context": "deepep_ht"}, False, None),
    # The fused block at the same layout, for comparison.
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 1, 8, 8, None, False, None),
    # EPLB and redundant slots on the fused block: read, but the graph and its times are the
    # fused case's above (the forward-pass config never selects the large-EP graph).
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 1, 8, 8, None, True, 288),
    # EPLB: routing skew power_law_0.6, which moe_perf lacks (falls back to uniform: also absent).
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", "0.24.0", 1, 8, 8, {"context": "deepep_ht"}, True, None),
]
QUERIES = [(2, 3000, 0), (1, 100, 0), (4, 1000, 500), (16, 8192, 0)]


def main():
    for model, system, backend, version, tp, dp, ep, comm, eplb, slots in CASES:
        gpn = load_system_spec(system)["node"]["num_gpus_per_node"]
        mc = ModelConfig(tp_size=tp, pp_size=1, attention_dp_size=dp, moe_tp_size=1, moe_ep_size=ep,
                         enable_eplb=eplb, wideep_num_slots=slots, moe_comm_backend=comm,
                         num_gpus_per_node=gpn if comm else None, system=system)
        info = _get_model_info(model)
        _apply_model_quant_defaults(mc, info.get("raw_config", {}), info["architecture"], backend, worker_name=model)
        case = {"model": model, "system": system, "backend": backend, "tp": tp, "dp": dp, "ep": ep,
                "comm": comm, "eplb": eplb, "slots": slots}
        try:
            db = get_database(system, backend, version)
            m = get_model(model, mc, backend)
            be = get_backend(backend, system)
            for b, isl, prefix in QUERIES:
                rc = RuntimeConfig(batch_size=b, isl=isl, osl=2, prefix=prefix)
                ops = be._run_static_breakdown(m, db, rc, "static_ctx", 32, 1.0, img_ctx_tokens=0,
                                               include_energy=False)[0]
                print(json.dumps({"case": case, "q": [b, isl, prefix],
                                  "ops": {k: repr(float(v)) for k, v in ops.items()},
                                  "total": repr(float(sum(ops.values())))}))
        except Exception as e:  # a refused case: print why
            print(json.dumps({"case": case, "error": f"{type(e).__name__}: {e}"}))


if __name__ == "__main__":
    main()
