#!/usr/bin/env python3
"""Record aisimulate 0.13's FPM-interpolation latency of single passes on a generated table, for
servesim's per-pass goldens (crates/perf/tests/fpm_passes.rs).

Usage: $AISIM_REF_VENV/bin/python scripts/fpm_pass_goldens.py
servesim times a uniform batch, so every prefill total is a multiple of its batch.
Writes the table with scripts/fpm_table.py (--decode-batches 1,2,4,5,8,9,16 --decode-context
256,4096,256 --prefill-kv 4096,16384 --prefill-kv-batches 1,2,4,8,16) into a temporary directory, builds the reference's estimator on it
(RustForwardPassPerfModel.best_available with estimation_mode fpm_interpolation and
estimator_config.fpm_interpolation.fpm_parquet_path) and prints one line per point:
  prefill BATCH TOTAL_PREFILL_TOKENS TOTAL_KV_READ_TOKENS MS   (predict_prefill_latency_total)
  decode BATCH TOTAL_PAST_KV_TOKENS MS                         (predict_decode_latency_total)
with MS the repr of the double, or `error: MESSAGE` where the reference refuses the point.

--chunked: the same lines for the passes of the concurrency-20 golden
(tests/fpm/predict_fpm_interp_qwen3_8b_c20.yaml) on its table (fpm_table.py --prefill-kv 1024,4096
--prefill-min-tokens 8 --decode-batches 1..24): the mixed pass at t=920.465657 ms prefills a
chunk remainder (8 new tokens over 1016 cached) beside four whole prompts, the iteration totals
(5, 4104, 1016); the reference's engine times it there, not at the integer means (5, 4105, 1015).

--deployment dsv32-sglang: the same points and table layout for DeepSeek-V3.2 (DSA sparse attention)
on an H200 TP8 (moe_tp 8) under SGLang 0.5.14, fp8_block weights and an fp8 KV cache
(fpm_table.py ... --model deepseek-ai/DeepSeek-V3.2 --backend sglang --version 0.5.14 --par
tp=8,moe_tp=8 --quant weight_quantization=fp8_block,gemm_quant_mode=fp8_block,moe_quant_mode=fp8_block,
kv_cache_dtype=fp8): the points off the curves transfer through the DSA block's roofline.
--deployment glm52-sglang: nvidia/GLM-5.2-NVFP4 on a B200 TP8 (moe_tp 8) under SGLang 0.5.14, where
57 of 78 layers reuse the top-k index (the prefill roofline blends the indexer-computing and reuse
layers); --deployment glm52-vllm: the same under vLLM 0.24.0, whose decode roofline blends them too.
--deployment q30-dcp2-vllm / q30-dcp1-vllm: Qwen/Qwen3-30B-A3B on an H200 TP8 (moe_tp 8) under vLLM 0.24.0
stating decode context parallelism 2 / 1, on a table with a dcp column holding both cells (fpm_table.py
... --dcp 1,2): the dcp-2 deployment reads its cell's measured curves and refuses every transfer.
--deployment glm5-cp8-sglang: zai-org/GLM-5-FP8 on an H200 with prefill context parallelism 8 (moe_ep
8) under SGLang 0.5.14: a prefill transfer is refused (the DSA CP block has no roofline), decode ones
are not.
"""
import os
import subprocess
import sys
import tempfile

from aisimulate_core.sdk.rust_engine_step import RustForwardPassPerfModel

TABLE_ARGS = ["--decode-batches", "1,2,4,5,8,9,16", "--decode-context", "256,4096,256",
              "--prefill-kv", "4096,16384", "--prefill-kv-batches", "1,2,4,8,16"]

PREFILL = [
    (1, 1024, 0), (4, 4096, 0), (3, 1002, 0), (16, 16384, 0), (7, 301, 0),  # collected sites
    (20, 4000, 0), (32, 8192, 0), (40, 2600, 0), (64, 16384, 0),            # batch above 16: clamp
    # the roofline transfer: an uncollected site (3, 4096); a KV between sites (4, 8192), with
    # distance ties at the fourth neighbour; a KV within 32 tokens of the KV-0 sites; a site
    # whose token curve (up to 4096) does not cover 8192; a batch above 16 clamped under KV
    # pressure onto a collected site and onto an uncollected one
    (3, 3000, 3 * 1365), (6, 3000, 6 * 683), (4, 4096, 8192), (4, 2048, 16), (4, 8192, 4096),
    (2, 6144, 16384), (32, 2048, 16384), (32, 2048, 8192), (64, 4096, 16384),
    (1, 3000, 100),                                                         # no site within reach
]
DECODE = [
    (4, 4000), (16, 16 * 1000), (2, 2 * 1100 + 7), (9, 9 * 300),            # collected batches
    (3, 3 * 1000), (3, 3 * 2500 + 1), (6, 6 * 900), (7, 7 * 2000),          # rungs (2, 4), (5, 8)
    (12, 12 * 1000), (15, 15 * 3000 + 5), (12, 20000),                      # (9, 16)
    (3, 900), (12, 40000),                                                  # one row covers
    (14, 3000), (12, 2000),                                                 # row 9 only; neither
    # a collected batch whose own KV curve does not cover the point: the roofline transfer
    (4, 20000), (1, 8000), (2, 9000), (16, 3000), (9, 40000), (1, 256 * 3),
]


CHUNKED_TABLE_ARGS = ["--prefill-kv", "1024,4096", "--prefill-min-tokens", "8",
                      "--decode-batches", ",".join(str(b) for b in range(1, 25))]
# The c20 replay's passes: the chunk-remainder pass at its totals and at the integer means, the
# whole-prompt passes beside it, and its decode part (15 requests, 15383 tokens, 15 current).
CHUNKED_PREFILL = [(5, 4104, 1016), (5, 4105, 1015), (8, 8192, 0), (8, 8184, 0), (8, 7180, 1012),
                   (6, 5132, 1012), (1, 8, 1016)]
CHUNKED_DECODE = [(15, 15368), (8, 8192), (20, 22983)]


QWEN = dict(model="Qwen/Qwen3-8B", system="h200_sxm", backend="vllm", backend_version="0.24.0")
# name -> (the estimator's deployment, fpm_table.py's identity options)
DEPLOYMENTS = {
    "qwen3-8b": (QWEN, []),
    "dsv32-sglang": (
        dict(model="deepseek-ai/DeepSeek-V3.2", system="h200_sxm", backend="sglang", backend_version="0.5.14",
             tp=8, moe_tp_size=8, moe_ep_size=1),
        ["--model", "deepseek-ai/DeepSeek-V3.2", "--backend", "sglang", "--version", "0.5.14", "--cell", "dsv32_tp8",
         "--par", "tp=8,moe_tp=8", "--quant", "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,"
         "moe_quant_mode=fp8_block,kv_cache_dtype=fp8"]),
    "glm52-sglang": (
        dict(model="nvidia/GLM-5.2-NVFP4", system="b200_sxm", backend="sglang", backend_version="0.5.14",
             tp=8, moe_tp_size=8, moe_ep_size=1),
        ["--model", "nvidia/GLM-5.2-NVFP4", "--system", "b200_sxm", "--backend", "sglang", "--version", "0.5.14",
         "--cell", "glm52_tp8", "--par", "tp=8,moe_tp=8", "--quant", "weight_quantization=nvfp4,"
         "gemm_quant_mode=nvfp4,moe_quant_mode=nvfp4,kv_cache_dtype=fp8"]),
}
DEPLOYMENTS["glm52-vllm"] = (
    dict(DEPLOYMENTS["glm52-sglang"][0], backend="vllm", backend_version="0.24.0"),
    [a.replace("sglang", "vllm").replace("0.5.14", "0.24.0") for a in DEPLOYMENTS["glm52-sglang"][1]])
DEPLOYMENTS["glm5-cp8-sglang"] = (
    dict(model="zai-org/GLM-5-FP8", system="h200_sxm", backend="sglang", backend_version="0.5.14",
         tp=1, moe_tp_size=1, moe_ep_size=8, cp_size=8),
    ["--model", "zai-org/GLM-5-FP8", "--backend", "sglang", "--version", "0.5.14", "--cell", "glm5_cp8",
     "--par", "cp=8,moe_ep=8", "--quant", "weight_quantization=fp8_block,gemm_quant_mode=fp8_block,"
     "moe_quant_mode=fp8_block,kv_cache_dtype=fp8"])
# Decode context parallelism (vLLM only): a table with a dcp column holding a dcp-1 and a dcp-2 cell
# of Qwen3-30B-A3B on an H200 TP8 (moe_tp 8); the DCP cell's decode rows are timed over the KV
# stripe (fpm_table.py --dcp). A deployment stating dcp 2 reads the dcp-2 cell at the whole
# group's totals and refuses every roofline transfer; one stating dcp 1 reads the dcp-1 cell and
# transfers as without DCP.
Q30 = ["--model", "Qwen/Qwen3-30B-A3B", "--cell", "q30_tp8", "--par", "tp=8,moe_tp=8", "--dcp", "1,2"]
for dcp in (1, 2):
    DEPLOYMENTS[f"q30-dcp{dcp}-vllm"] = (
        dict(model="Qwen/Qwen3-30B-A3B", system="h200_sxm", backend="vllm", backend_version="0.24.0",
             tp=8, moe_tp_size=8, moe_ep_size=1, dcp=dcp), Q30)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    chunked = "--chunked" in sys.argv[1:]
    name = sys.argv[sys.argv.index("--deployment") + 1] if "--deployment" in sys.argv else "qwen3-8b"
    deployment, identity = DEPLOYMENTS[name]
    table_args, prefill, decode = ((CHUNKED_TABLE_ARGS, CHUNKED_PREFILL, CHUNKED_DECODE) if chunked
                                   else (TABLE_ARGS, PREFILL, DECODE))
    table_args = table_args + identity
    with tempfile.TemporaryDirectory(prefix="fpm-pass-") as tmp:
        subprocess.run([sys.executable, os.path.join(here, "fpm_table.py"), tmp, *table_args],
                       check=True, stdout=subprocess.DEVNULL)
        model = RustForwardPassPerfModel.best_available(dict(
            **deployment, worker_type="aggregated", estimation_mode="fpm_interpolation",
            estimator_config={"fpm_interpolation": {
                "fpm_parquet_path": os.path.join(tmp, "fpm_forward_perf.parquet")}}))
        for b, t, kv in prefill:
            try:
                value = repr(model.predict_prefill_latency_total(b, t, kv))
            except Exception as e:  # the reference's refusal, recorded verbatim
                value = f"error: {e}"
            print(f"prefill {b} {t} {kv} {value}")
        for b, kv in decode:
            try:
                value = repr(model.predict_decode_latency_total(b, kv))
            except Exception as e:
                value = f"error: {e}"
            print(f"decode {b} {kv} {value}")


if __name__ == "__main__":
    main()
