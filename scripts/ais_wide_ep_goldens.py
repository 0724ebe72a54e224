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

`--sglang` prints instead SGLang's wide-EP graphs of the MLA and DSA families (SGLANG_CASES).
"""
import json
import logging
import sys

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

# `--sglang`: SGLang 0.5.14's wide-EP graphs of the MLA and DSA families (DeepSeek-V3 / V3.2,
# GLM-5), context phase on DeepEP high-throughput, as the Task enumerator's resolver builds them:
# it also sets DeepSeek-V3-architecture models' attention to fp8_block over an fp8 KV cache (the
# wide-EP MLA rows' labels). (model, system, tp, attention dp, moe_ep, cp, enable_eplb, slots)
SGLANG_CASES = [
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 8, 8, 1, False, None),
    # Two nodes: the legacy EP8 DeepEP curve stands in for EP16.
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 16, 16, 1, False, None),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 2, 8, 16, 1, False, None),
    # EPLB: tokens x 0.8 at power_law_0.6.
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 16, 16, 1, True, None),
    # Prefill context parallelism beside large EP (SGLang takes it only without attention TP / DP).
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 1, 8, 8, False, None),
    ("deepseek-ai/DeepSeek-V3.2", "h200_sxm", 1, 8, 8, 1, False, None),
    ("deepseek-ai/DeepSeek-V3.2", "h200_sxm", 2, 4, 8, 1, True, None),
    ("deepseek-ai/DeepSeek-V3.2", "b200_sxm", 1, 16, 16, 1, False, None),
    # Refused for want of data, as the reference refuses them:
    # redundant EPLB slots (the wide-EP compute tables hold num_slots = experts only),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 16, 16, 1, True, 288),
    # no EP8 context compute rows on b200,
    ("deepseek-ai/DeepSeek-V3", "b200_sxm", 1, 8, 8, 1, False, None),
    # GLM-5's expert shape (hidden 6144) is not in the wide-EP compute tables,
    ("zai-org/GLM-5-FP8", "h200_sxm", 1, 8, 8, 1, False, None),
    # DSA prefill CP needs the sparse-attention tables h200 lacks.
    ("deepseek-ai/DeepSeek-V3.2", "h200_sxm", 1, 1, 8, 8, False, None),
]


def sglang():
    from aisimulate.sdk import common
    for model, system, tp, dp, ep, cp, eplb, slots in SGLANG_CASES:
        gpn = load_system_spec(system)["node"]["num_gpus_per_node"]
        comm = {"context": "deepep_ht"}
        mc = ModelConfig(tp_size=tp, pp_size=1, attention_dp_size=dp, moe_tp_size=1, moe_ep_size=ep, cp_size=cp,
                         enable_eplb=eplb, wideep_num_slots=slots, moe_comm_backend=comm, num_gpus_per_node=gpn,
                         system=system)
        info = _get_model_info(model)
        _apply_model_quant_defaults(mc, info.get("raw_config", {}), info["architecture"], "sglang", worker_name=model)
        if info["architecture"] == "DeepseekV3ForCausalLM":
            mc.fmha_quant_mode = common.FMHAQuantMode.fp8_block
            mc.kvcache_quant_mode = common.KVCacheQuantMode.fp8
        case = {"model": model, "system": system, "tp": tp, "dp": dp, "ep": ep, "cp": cp, "eplb": eplb, "slots": slots}
        try:
            db = get_database(system, "sglang", "0.5.14")
            m = get_model(model, mc, "sglang")
            be = get_backend("sglang", system)
            # Resident weights: the context graph's (the wide-EP graph takes no checkpoint correction).
            print(json.dumps({"case": case, "weights": repr(float(sum(op.get_weights() for op in m.context_ops)))}))
            for b, isl, prefix in QUERIES:
                rc = RuntimeConfig(batch_size=b, isl=isl, osl=2, prefix=prefix)
                ops = be._run_static_breakdown(m, db, rc, "static_ctx", 32, 1.0, img_ctx_tokens=0,
                                               include_energy=False)[0]
                print(json.dumps({"case": case, "q": [b, isl, prefix],
                                  "ops": {k: repr(float(v)) for k, v in ops.items()},
                                  "total": repr(float(sum(ops.values())))}))
            # One decode step of `b` requests after an `isl`-token prompt (osl 2: the step at
            # context isl + 1, servesim's decode_ms(b, isl + 1)); the generation phase keeps
            # the fused MoE block (DeepEP low-latency is not selected).
            for b, isl in DECODE_QUERIES:
                rc = RuntimeConfig(batch_size=b, isl=isl, osl=2, prefix=0)
                ops = be._run_static_breakdown(m, db, rc, "static_gen", 32, 1.0, img_ctx_tokens=0,
                                               include_energy=False)[2]
                print(json.dumps({"case": case, "decode": [b, isl + 1],
                                  "ops": {k: repr(float(v)) for k, v in ops.items()},
                                  "total": repr(float(sum(ops.values())))}))
        except Exception as e:  # a refused case: print why
            print(json.dumps({"case": case, "error": f"{type(e).__name__}: {e}"}))


DECODE_QUERIES = [(8, 2000), (64, 4096), (1, 100)]


def main():
    if "--sglang" in sys.argv[1:]:
        return sglang()
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
