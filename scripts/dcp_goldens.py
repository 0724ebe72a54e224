#!/usr/bin/env python3
"""The reference's numbers behind crates/perf/tests/dcp.rs (decode context parallelism).

Run with the aisimulate reference venv's python:

    $AISIM_REF_VENV/bin/python scripts/dcp_goldens.py

For each forward-pass config: the static prefill step (4 requests reaching 2048 tokens, 1024 of
them cached) and the static decode step (4 requests at context_length 2048, servesim's
`decode_ms(4, 2049)`) as the sums of `static_phase_diagnostics`, and the KV capacity in blocks
(`estimate_num_gpu_blocks`, max_num_tokens 8192, max_batch_size 256, the backend's default memory
fraction) at the config's `dcp` (and `cp_size`).

The DSA cases (DeepSeek-V3.2, GLM-5.x) are vLLM decode CP and SGLang prefill CP (`cp_size`, the
experts over the CP ranks); GLM-5.2 runs on B200, the others on H200. Kimi-K3 is SGLang decode CP
on B300 (its MLA layers striped, the query side replicated; dcp 1 for the capacity beside it).

`--only MODEL` prints just that model's cases.
"""
import json
import sys

from aisimulate_core.sdk import RustForwardPassPerfModel
from aisimulate_core.sdk.memory.kv_cache import estimate_num_gpu_blocks

CASES = [
    ({"model": "deepseek-ai/DeepSeek-V3", "backend": "vllm", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}, 64),
    ({"model": "deepseek-ai/DeepSeek-V3", "backend": "vllm", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 8}, 64),
    ({"model": "deepseek-ai/DeepSeek-V3", "backend": "sglang", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 4}, 1),
    ({"model": "moonshotai/Kimi-K2.5", "backend": "vllm", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 4}, 64),
    ({"model": "Qwen/Qwen3-30B-A3B", "backend": "vllm", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}, 64),
    ({"model": "deepseek-ai/DeepSeek-V3.2", "backend": "vllm", "tp": 8, "moe_tp_size": 8, "moe_ep_size": 1, "dcp": 2}, 64),
    ({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8, "dcp": 4}, 64),
    ({"model": "zai-org/GLM-5-FP8", "backend": "sglang", "tp": 1, "moe_tp_size": 1, "moe_ep_size": 8, "cp_size": 8,
      "dcp": 1}, 1),
    ({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 1, "moe_tp_size": 1,
      "moe_ep_size": 4, "cp_size": 4, "dcp": 1}, 1),
    ({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8, "dcp": 2}, 1),
    ({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8, "dcp": 8}, 1),
    ({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8, "dcp": 1}, 1),
]


def main():
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    for cfg, block in CASES:
        if only and cfg["model"] != only:
            continue
        cfg = {"system": "h200_sxm", "worker_type": "aggregated", **cfg}
        model = RustForwardPassPerfModel.best_available(dict(cfg))
        step = lambda prefill, **kw: sum(
            op["latency_ms"]
            for op in model.static_phase_diagnostics(batch_size=4, context_length=2048, prefill=prefill, **kw)
        )
        blocks = estimate_num_gpu_blocks(
            cfg["model"], cfg["system"], cfg["backend"], scheduler_block_size=block, max_num_tokens=8192,
            max_batch_size=256, memory_fraction_kind="of_total",
            memory_fraction_value=0.9 if cfg["backend"] == "vllm" else 0.88, tp_size=cfg["tp"],
            moe_tp_size=cfg["moe_tp_size"], moe_ep_size=cfg["moe_ep_size"], cp_size=cfg.get("cp_size", 1),
            dcp_size=cfg["dcp"])
        print(json.dumps({"config": cfg, "prefill_ms": step(True, prefix=1024), "decode_ms": step(False),
                          "block_size": block, "blocks": blocks}))


if __name__ == "__main__":
    main()
