#!/usr/bin/env python3
"""Print the reference numbers behind crates/perf/tests/golden.rs.

Run with the aisimulate reference venv's python (aisimulate 0.13.0.dev202610270000000085):

    $AISIM_REF_VENV/bin/python scripts/ais_goldens.py

Step times: `RustForwardPassPerfModel.best_available(cfg)`, then `static_phase_diagnostics(...)`
summed over ops for a prefill (batch, isl, prefix) and for one decode step at
`context_length = context - 1` (what servesim's `decode_ms(batch, context)` answers), and
`estimate_forward_pass_time_ms` for forward passes (one FPM per attention-DP rank; the
reference takes the slowest rank). The engine-facing timer is checked against the forward
passes Dynamo 1.6.1's AIS session builds (`dynamo/_internal/ais.py`): a prefill of `batch`
requests of mean length `isl` with `prefix` cached is `{P: batch, T: batch·(isl − prefix),
C: batch·prefix}`, a decode step at mean context `c` is `{D: batch, K: batch·(c + 1)}`. KV capacity: `estimate_num_gpu_blocks(...)` with
max_num_tokens 8192, max_batch_size 256 and the backend's default memory fraction of the
total (vLLM 0.9, SGLang 0.88; TRT-LLM: 0.9 of the free memory).

`--llama4-tiles` prints Llama 4's image geometry (tiles, tokens, embedding bytes) behind
crates/perf/tests/vision.rs's Llama 4 case.

`--kimi-k3-tower` prints Kimi K3's image geometry (`BaseBackend._encoder_workload_per_visual`: patches
and merged tokens after the processor's patch budget and padding) and each op of its tower on one
encoder-only worker (`build_kimi_k3_encoder_ops(enc_cfg, tp, enable_encoder_dp=False)` through
`_run_encoder_phase`) and its memory (`run_encoder_static`) on b300_sxm / SGLang 0.5.14, behind
crates/perf/tests/vision.rs's Kimi K3 case.
The installed data has no bf16 encoder attention rows of head size 128 (Kimi K3's 1536 / 12) on any
system, so the attention op is left out of the list (the reference's predict refuses the pool there).

`--vision` prints instead the numbers behind crates/perf/tests/vision.rs: Qwen3-VL's vision tower on
one encoder-only worker (`build_encoder_ops(enc_cfg, tp, enable_encoder_dp=False)`), each op of one
batch (`BaseBackend._run_encoder_phase`) and its memory (`run_encoder_static`), h200_sxm / vLLM 0.24.0.

`--dsv4-kv` prints instead the numbers behind crates/perf/tests/dsv4.rs: DeepSeek-V4's KV bytes per
sequence (`DeepSeekV4Model.get_kvcache_bytes_per_sequence`) and the longest sequence a byte budget
holds (`BaseModel._binary_search_kvcache_max_tokens`), on the packaged configs, with fp8 and bf16
KV entries (servesim does not time DeepSeek-V4 yet, so these are read off the model class).

`--dsv4` prints instead the step times and KV capacity behind crates/perf/tests/dsv4.rs's
`timing_goldens`: DeepSeek-V4-Flash and -Pro (fp8_block projections, MXFP4 x MXFP8 routed experts,
fp8 KV, bf16 attention tables) on B200 / vLLM 0.24.0, experts split by EP and by TP.

`--dsv4-sglang` prints instead the numbers behind crates/perf/tests/dsv4.rs's `sglang_timing_goldens`:
DeepSeek-V4 on SGLang 0.5.14 (CSA top-k correction, the fp4 experts' Blackwell kernel lane).

`--nemotron-h` prints instead the step times and KV capacity behind crates/perf/tests/nemotron_h.rs:
NVIDIA Nemotron-3 Nano (bf16), Super (FP8, NVFP4; latent MoE) and Ultra (FP8, NVFP4; depth given
only as layers_block_type) on H200 / vLLM 0.24.0, B200 / SGLang 0.5.14 and H200 / TRT-LLM (whose
shared linear-attention layer carries measured Mamba2 conv rows), experts split by EP.
`--qwen3vl` prints instead the step times and KV capacity behind crates/perf/tests/qwen3vl.rs: the
Qwen3-VL wrappers' text path (dense and MoE, every backend), with Qwen3-8B beside Qwen3-VL-8B.

`--glimmer` prints instead the step times and KV capacity behind crates/perf/tests/glimmer.rs:
meta-models/Muse-Glimmer-30B (sliding-window / global layers, attention output gate, rotary-free
global layers, window-capped KV) on each backend, prompts and contexts inside and past the window.

`--msa-nvfp4` prints instead the step times and KV capacity behind golden.rs's
`msa_nvfp4_goldens`: nvidia/MiniMax-M3-NVFP4, the ModelOpt MIXED_PRECISION checkpoint (MXFP8
projections and shared experts → fp8_block GEMMs, NVFP4 routed experts, bf16 KV and attention).

`--mla-cp` prints instead the step times and KV capacity behind golden.rs's `mla_prefill_cp_goldens`:
SGLang prefill context parallelism on DeepSeek-V3 (CP 4 beside two pipeline stages), Kimi-K2.5 (CP 2
with one MTP layer) and DeepSeek-V3.1-NVFP4 (CP 2 on B200: the granular MLA chain).

`--kimi-k3` prints instead the step times and KV capacity behind crates/perf/tests/kimi_k3.rs.
`--dsv41` prints instead the step times behind crates/perf/tests/dsv41.rs: DeepSeek-V4.1-Flash on
the `full` execution profile (systems/profiles/dsv41/full, B300 and GB300 / SGLang, TP4), at prompts
and KV lengths past the measured module curves (the boundary's utilisation of each roofline held).
`--qwen35` prints instead the step times and KV capacity behind crates/perf/tests/qwen35_goldens.rs:
Qwen3.5 (GDN linear attention + gated full attention) dense 27B and MoE 35B-A3B on H200 / vLLM
0.24.0, and the NVFP4 122B-A10B on B200 (bf16 projections and shared experts by exclusion); then
the same family on SGLang 0.5.14 and TRT-LLM 1.3.0rc20 / rc23 (H200, B200).
"""
import json
import os
import sys
import types

import aisimulate_core
from aisimulate_core.sdk import RustForwardPassPerfModel
from aisimulate_core.sdk.memory.kv_cache import estimate_num_gpu_blocks

MIXED = {"num_prefill_requests": 3, "sum_prefill_tokens": 2000, "sum_prefill_kv_tokens": 3000,
         "num_decode_requests": 100, "sum_decode_kv_tokens": 70000}
DECODE_RANK = {"num_decode_requests": 40, "sum_decode_kv_tokens": 40 * 3000}

STEPS = [
    ({"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "tp": 2},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("prefill", (3, 33000, 0)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [MIXED])]),
    ({"model": "meta-llama/Meta-Llama-3.1-8B", "system": "h100_sxm", "backend": "sglang", "tp": 1},
     [("prefill", (4, 777, 0)), ("decode", (256, 8000)), ("decode", (1024, 1024))]),
    ({"model": "Qwen/Qwen3-8B", "system": "h100_sxm", "backend": "vllm", "tp": 4},
     [("prefill", (1, 20000, 0)), ("decode", (33, 5000))]),
    # Mixture of experts.
    ({"model": "Qwen/Qwen3-30B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 1, "moe_ep_size": 2},
     [("timer_prefill", (2, 2500, 700)), ("timer_decode", (16, 1100)), ("prefill", (4, 1000, 0)), ("prefill", (2, 2500, 700)), ("prefill", (1, 20000, 0)), ("decode", (16, 1100)),
      ("decode", (1024, 1024)), ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3-235B-A22B", "system": "h100_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1},
     [("prefill", (1, 8192, 0)), ("decode", (64, 4097))]),
    ({"model": "openai/gpt-oss-20b", "system": "h200_sxm", "backend": "trtllm", "tp": 1, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 3000, 0)), ("decode", (33, 5000)), ("fpm", [MIXED, DECODE_RANK])]),
    ({"model": "Qwen/Qwen3-30B-A3B-FP8", "system": "h100_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 2, "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (128, 1500))]),
    ({"model": "MiniMaxAI/MiniMax-M2.7", "system": "h200_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (2, 3000, 500)), ("decode", (64, 2049))]),
    # Static per-tensor FP8 (ModelOpt): fp8 GEMMs minus the scale kernels, fp8 KV.
    ({"model": "Qwen/Qwen3-32B-FP8-Static-PerTensor", "system": "h200_sxm", "backend": "vllm", "tp": 1},
     [("prefill", (2, 2500, 700)), ("decode", (64, 2049))]),
    ({"model": "nvidia/Llama-3.1-70B-Instruct-FP8", "system": "h200_sxm", "backend": "sglang", "tp": 2},
     [("prefill", (1, 8192, 0)), ("decode", (16, 1100))]),
    # NVFP4 (ModelOpt) on Blackwell: nvfp4 GEMMs and experts; TRT-LLM's low-latency expert
    # kernel at small batches; quantised all-gather under attention DP.
    ({"model": "nvidia/Qwen3-235B-A22B-NVFP4", "system": "b200_sxm", "backend": "trtllm", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (2, 3000, 0)), ("decode", (64, 2049)), ("decode", (256, 1100))]),
    ({"model": "nvidia/Qwen3-235B-A22B-NVFP4", "system": "b200_sxm", "backend": "trtllm", "tp": 2, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("fpm", [MIXED, DECODE_RANK])]),
    ({"model": "nvidia/MiniMax-M2.7-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000))]),
    # DeepSeek-V3.1-NVFP4 keeps q / kv projections in bf16: granular MLA chain, bf16 BMMs.
    ({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 4, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    # Kimi-K2.5 / K2.6 / K2.7 (KimiK25ForConditionalGeneration): DeepSeek-V3's text model under
    # text_config. moonshotai/Kimi-K2.5 is compressed-tensors INT4 on the routed experts only
    # (int4_wo experts, bf16 attention and shared experts, bf16 KV); the NVFP4 releases keep
    # the attention block (and K2.6 / K2.7 the shared experts) in bf16.
    ({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/Kimi-K2.5-NVFP4", "system": "b200_sxm", "backend": "trtllm", "tp": 4, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/Kimi-K2.6-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/Kimi-K2.7-Code-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    # DeepSeek sparse attention: DSA module tables; SGLang times the dense first layers apart;
    # GLM-5.2 blends its reuse layers (21 / 78 compute the index); the NVFP4 releases keep
    # q / kv / indexer (DeepSeek-V3.2) or the whole block and shared experts (GLM-5.2) in bf16.
    ({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "deepseek-ai/DeepSeek-V3.2", "system": "h200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 8,
      "moe_ep_size": 1},
     [("prefill", (2, 3000, 500)), ("decode", (33, 5000)), ("fpm", [MIXED])]),
    ({"model": "zai-org/GLM-5.2-FP8", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "nvidia/DeepSeek-V3.2-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/GLM-5.2-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    # Gemma 4: sliding-window (head 256, window 1024) and global (head 512, K = V) blocks, the
    # dense MLP beside 128 routed experts; the NVFP4 release keeps attention and MLP in bf16.
    ({"model": "google/gemma-4-26B-A4B", "system": "h200_sxm", "backend": "vllm", "tp": 1, "moe_tp_size": 1,
      "moe_ep_size": 1},
     [("prefill", (4, 1024, 0)), ("prefill", (1, 20000, 0)), ("decode", (16, 1100)), ("decode", (7, 131072))]),
    ({"model": "google/gemma-4-26B-A4B", "system": "h200_sxm", "backend": "sglang", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (2, 3000, 500)), ("decode", (33, 5000)), ("mixed", [MIXED])]),
    ({"model": "nvidia/Gemma-4-26B-A4B-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 2,
      "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    # Local / global attention with MoE and dense layers (HYBRIDMOE): Llama-4 Scout (all MoE,
    # chunked local attention of 8192), Maverick (MoE and dense layers alternating), MiMo-V2-Flash
    # (fp8 block, local layers of their own widths and a 128-token window).
    ({"model": "meta-llama/Llama-4-Scout-17B-16E-Instruct", "system": "h200_sxm", "backend": "vllm", "tp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 3000, 0)), ("prefill", (1, 20000, 0)), ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "meta-llama/Llama-4-Maverick-17B-128E-Instruct", "system": "h200_sxm", "backend": "sglang", "tp": 8,
      "moe_tp_size": 1, "moe_ep_size": 8},
     [("prefill", (2, 3000, 500)), ("decode", (33, 5000))]),
    ({"model": "XiaomiMiMo/MiMo-V2-Flash", "system": "h200_sxm", "backend": "trtllm", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (64, 4097))]),
    # MiniMax-M3: the MSA block from its own msa_*_module tables, DSA's graph around it.
    ({"model": "MiniMaxAI/MiniMax-M3", "system": "h200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [MIXED])]),
]

# nvidia/MiniMax-M3-NVFP4 (`--msa-nvfp4`): Blackwell only (fp4 tensor cores), vLLM (the only
# backend with MSA tables at its default version), experts split by EP and by TP. Forward passes
# prefill-only, decode-only and mixed (the MSA block is the pass's `context_attention`, timed apart
# at the prefill shape).
DSV4_STEPS = [
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "vllm", "tp": 1, "moe_tp_size": 1,
      "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [MIXED])]),
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "vllm", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (64, 4097))]),
    ({"model": "deepseek-ai/DeepSeek-V4-Pro", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 8192, 0)), ("decode", (16, 1100)), ("decode", (33, 5000)),
      ("fpm", [MIXED])]),
]
# `--dsv4-sglang`: DeepSeek-V4 on SGLang 0.5.14 (the CSA top-k correction off the CSA modules;
# the fp4 experts on the trtllm-gen MXFP4 x MXFP8 lane on Blackwell), Flash / Pro, experts split by
# EP and by TP, attention DP with moe_backend deepep_moe (the default graph), the FP8 re-quantised
# Flash on H200 (fp8_block experts); both under prefill context parallelism.
DSV4_SGLANG_STEPS = [
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "sglang", "tp": 1,
      "moe_tp_size": 1, "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [MIXED])]),
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (64, 4097))]),
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "sglang", "tp": 1, "attention_dp": 4,
      "moe_tp_size": 1, "moe_ep_size": 4, "moe_backend": "deepep_moe"},
     [("prefill", (3, 3000, 777)), ("decode", (17, 1234)), ("fpm", [MIXED])]),
    ({"model": "deepseek-ai/DeepSeek-V4-Pro", "system": "b300_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (5, 9000, 1000)), ("decode", (33, 5000)), ("fpm", [MIXED])]),
    ({"model": "sgl-project/DeepSeek-V4-Flash-FP8", "system": "h200_sxm", "backend": "sglang", "tp": 4,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    # Prefill context parallelism (CP 2 over expert parallelism 2, CP 4 over expert TP 4).
    ({"model": "deepseek-ai/DeepSeek-V4-Flash", "system": "b200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 4096, 0)), ("prefill", (3, 3000, 777)), ("prefill", (1, 16000, 0)), ("decode", (16, 1100)),
      ("fpm", [MIXED])]),
    ({"model": "sgl-project/DeepSeek-V4-Flash-FP8", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 4,
      "moe_tp_size": 4, "moe_ep_size": 1},
     [("prefill", (2, 3000, 0)), ("prefill", (1, 8000, 192)), ("decode", (16, 1100))]),
]
DSV4_SGLANG_KV = [
    ("deepseek-ai/DeepSeek-V4-Flash", "b200_sxm", "sglang", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 1),
    ("deepseek-ai/DeepSeek-V4-Pro", "b300_sxm", "sglang", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
]
NEMOTRON_H_STEPS = [
    ({"model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "system": "h200_sxm", "backend": "vllm", "tp": 1,
      "moe_tp_size": 1, "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [MIXED])]),
    ({"model": "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "system": "h200_sxm", "backend": "vllm", "tp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (4, 777, 0)), ("decode", (64, 4097)), ("fpm", [MIXED])]),
    ({"model": "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 1,
      "moe_tp_size": 1, "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8", "system": "h200_sxm", "backend": "vllm", "tp": 8,
      "moe_tp_size": 1, "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("decode", (33, 5000)), ("fpm", [MIXED])]),
    ({"model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "system": "h200_sxm", "backend": "trtllm", "tp": 1,
      "moe_tp_size": 1, "moe_ep_size": 1},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (3, 100000, 0)), ("decode", (16, 1100))]),
]
NEMOTRON_H_KV = [
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h200_sxm", "vllm", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 64),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "h200_sxm", "vllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2),
     64),
    ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "b200_sxm", "sglang",
     dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 1),
    ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8", "h200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8),
     64),
]
DSV4_KV = [
    ("deepseek-ai/DeepSeek-V4-Flash", "b200_sxm", "vllm", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 64),
    ("deepseek-ai/DeepSeek-V4-Pro", "b200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
]

PREFILL_RANK = {"num_prefill_requests": 3, "sum_prefill_tokens": 2000, "sum_prefill_kv_tokens": 3000}
MSA_NVFP4_STEPS = [
    ({"model": "nvidia/MiniMax-M3-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [PREFILL_RANK]), ("fpm", [DECODE_RANK]), ("fpm", [MIXED])]),
    ({"model": "nvidia/MiniMax-M3-NVFP4", "system": "gb200", "backend": "vllm", "tp": 8, "moe_tp_size": 8,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("prefill", (1, 8192, 0)), ("decode", (64, 4097)), ("decode", (256, 8000))]),
]
MSA_NVFP4_KV = [
    ("nvidia/MiniMax-M3-NVFP4", "b200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
]

QWEN35_STEPS = [
    ({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "vllm", "tp": 1},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("prefill", (1, 20000, 0)), ("decode", (16, 1100)),
      ("decode", (7, 131072)), ("fpm", [PREFILL_RANK]), ("fpm", [DECODE_RANK]), ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "nvidia/Qwen3.5-122B-A10B-NVFP4", "system": "b200_sxm", "backend": "vllm", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000)), ("fpm", [MIXED])]),
    # SGLang (fused shared-expert gate, no pre-dispatch) and TRT-LLM (pre-dispatch all-reduce
    # beside the attention one, serial shared expert), Hopper and Blackwell.
    ({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "sglang", "tp": 1},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("decode", (16, 1100)), ("decode", (7, 131072)),
      ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "b200_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 4,
      "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000))]),
    ({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "trtllm", "tp": 2},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "b200_sxm", "backend": "trtllm", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "nvidia/Qwen3.5-122B-A10B-NVFP4", "system": "b200_sxm", "backend": "trtllm", "tp": 4,
      "moe_tp_size": 4, "moe_ep_size": 1},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000)), ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "trtllm", "backend_version": "1.3.0rc23",
      "tp": 2, "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
]
# Qwen3.5 with attention DP (`--qwen35-dp`): vLLM gathers the ranks' tokens in the pre-dispatch;
# SGLang folds the attention all-reduce into it; TRT-LLM as without DP.
QWEN35_DP_STEPS = [
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 1, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED, DECODE_RANK])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "vllm", "tp": 2, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 1, "attention_dp": 4,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (2, 1000, 0)), ("prefill", (2, 3000, 500)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED, DECODE_RANK, PREFILL_RANK, MIXED])]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "h200_sxm", "backend": "sglang", "tp": 2, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "Qwen/Qwen3.5-35B-A3B", "system": "b200_sxm", "backend": "trtllm", "tp": 1, "attention_dp": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
    ({"model": "Qwen/Qwen3.5-27B", "system": "h200_sxm", "backend": "vllm", "tp": 1, "attention_dp": 2},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100))]),
]
QWEN35_KV = [
    ("Qwen/Qwen3.5-27B", "h200_sxm", "vllm", dict(tp_size=1), 64),
    ("Qwen/Qwen3.5-35B-A3B", "h200_sxm", "vllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 64),
    ("nvidia/Qwen3.5-122B-A10B-NVFP4", "b200_sxm", "vllm", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 64),
    ("Qwen/Qwen3.5-27B", "h200_sxm", "sglang", dict(tp_size=1), 1),
    ("Qwen/Qwen3.5-35B-A3B", "h200_sxm", "sglang", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 1),
    ("Qwen/Qwen3.5-27B", "h200_sxm", "trtllm", dict(tp_size=2), 32),
    ("Qwen/Qwen3.5-35B-A3B", "b200_sxm", "trtllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 32),
]
# Kimi-K3 (`--kimi-k3`): KDA + MLA + LatentMoE on SGLang (Blackwell) and vLLM (H200, B200).
KIMI_K3_STEPS = [
    ({"model": "moonshotai/Kimi-K3", "system": "b200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 4096, 1024)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 1,
      "moe_ep_size": 4},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000))]),
    # vLLM: the FlashKDA prefill, the fused decode kernel and the MLA module lane.
    ({"model": "moonshotai/Kimi-K3", "system": "h200_sxm", "backend": "vllm", "tp": 16, "moe_tp_size": 1,
      "moe_ep_size": 16},
     [("prefill", (2, 1000, 0)), ("prefill", (1, 4096, 1024)), ("decode", (16, 1100)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "moonshotai/Kimi-K3", "system": "b200_sxm", "backend": "vllm", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000))]),
]
KIMI_K3_KV = [
    ("moonshotai/Kimi-K3", "b300_sxm", "sglang", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
    ("moonshotai/Kimi-K3", "h200_sxm", "vllm", dict(tp_size=16, moe_tp_size=1, moe_ep_size=16), 64),
]
# DeepSeek-V4.1 (`--dsv41`): past the measured module curves of the `full` profile.
DSV41_PROFILE = os.path.join(os.path.dirname(aisimulate_core.__file__), "systems", "profiles", "dsv41", "full")
DSV41_STEPS = [
    ({"model": "deepseek-ai/DeepSeek-V4.1-Flash", "system": "b300_sxm", "backend": "sglang",
      "backend_version": "dev-c4ca651192e5", "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1,
      "systems_paths": [DSV41_PROFILE]},
     [("prefill", (1, 4096, 0)), ("prefill", (2, 3000, 0)), ("prefill", (1, 8192, 1536)), ("decode", (1, 8192)),
      ("decode", (2, 20000)), ("decode", (3, 4000))]),
    ({"model": "deepseek-ai/DeepSeek-V4.1-Flash", "system": "gb300", "backend": "sglang",
      "backend_version": "dev-800cc9adea5b", "tp": 4, "moe_tp_size": 4, "moe_ep_size": 1,
      "systems_paths": [DSV41_PROFILE]},
     [("prefill", (1, 65536, 0)), ("prefill", (2, 700, 512)), ("decode", (2, 30000))]),
]
# Kimi-K3 with DSPARK speculation (also `--kimi-k3`): KDA verify kernels (SGLang on B200 through
# the fused SM100 verify row, vLLM's Triton chain-verify pair on H200) and the draft model's ops
# and KV (SGLang's GQA draft, vLLM's MLA-style one).
KIMI_K3_SPEC_STEPS = [
    ({"model": "moonshotai/Kimi-K3", "system": "b200_sxm", "backend": "sglang", "tp": 8, "moe_tp_size": 1,
      "moe_ep_size": 8, "nextn": 3},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100)), ("decode", (64, 4097)), ("fpm", [MIXED])]),
    ({"model": "moonshotai/Kimi-K3", "system": "h200_sxm", "backend": "vllm", "tp": 16, "moe_tp_size": 1,
      "moe_ep_size": 16, "nextn": 2},
     [("prefill", (2, 1000, 0)), ("decode", (16, 1100)), ("decode", (64, 4097)), ("fpm", [MIXED])]),
    ({"model": "moonshotai/Kimi-K3", "system": "b300_sxm", "backend": "sglang", "tp": 4, "moe_tp_size": 1,
      "moe_ep_size": 4, "nextn": 1},
     [("decode", (33, 5000))]),
]
KIMI_K3_SPEC_KV = [
    ("moonshotai/Kimi-K3", "b300_sxm", "sglang", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8, nextn=3), 1),
    ("moonshotai/Kimi-K3", "h200_sxm", "vllm", dict(tp_size=16, moe_tp_size=1, moe_ep_size=16, nextn=2), 64),
]
# Qwen3-VL (`--qwen3vl`): text-only loads of the dense and MoE wrappers on each backend, and
# Qwen3-8B at the same shapes as Qwen3-VL-8B (only the Q/K-norm term of attention differs).
QWEN3VL_STEPS = [
    ({"model": "Qwen/Qwen3-VL-8B-Instruct", "system": "h200_sxm", "backend": "vllm", "tp": 1},
     [("prefill", (4, 1024, 0)), ("prefill", (2, 3000, 500)), ("decode", (4, 1025)), ("decode", (64, 4097)),
      ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "tp": 1},
     [("prefill", (4, 1024, 0)), ("decode", (4, 1025))]),
    ({"model": "Qwen/Qwen3-VL-32B-Instruct", "system": "h200_sxm", "backend": "sglang", "tp": 2},
     [("prefill", (1, 8192, 0)), ("decode", (16, 1100))]),
    ({"model": "Qwen/Qwen3-VL-2B-Instruct", "system": "h100_sxm", "backend": "trtllm", "tp": 1},
     [("prefill", (4, 777, 0)), ("decode", (33, 5000))]),
    ({"model": "Qwen/Qwen3-VL-30B-A3B-Instruct", "system": "h200_sxm", "backend": "vllm", "tp": 2, "moe_tp_size": 1,
      "moe_ep_size": 2},
     [("prefill", (2, 2500, 700)), ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "Qwen/Qwen3-VL-235B-A22B-Instruct", "system": "b200_sxm", "backend": "sglang", "tp": 4,
      "moe_tp_size": 4, "moe_ep_size": 1},
     [("prefill", (1, 8192, 0)), ("decode", (64, 4097))]),
]
QWEN3VL_KV = [
    ("Qwen/Qwen3-VL-8B-Instruct", "h200_sxm", "vllm", dict(tp_size=1), 64),
    ("Qwen/Qwen3-8B", "h200_sxm", "vllm", dict(tp_size=1), 64),
    ("Qwen/Qwen3-VL-32B-Instruct", "h200_sxm", "sglang", dict(tp_size=2), 1),
    ("Qwen/Qwen3-VL-4B-Instruct", "h100_sxm", "vllm", dict(tp_size=1), 32),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", "h200_sxm", "vllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 64),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", "b200_sxm", "sglang", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 1),
]

# Muse-Glimmer (`--glimmer`): 39 sliding-window layers (window 2048) and 13 global ones.
GLIMMER = "meta-models/Muse-Glimmer-30B"
GLIMMER_STEPS = [
    ({"model": GLIMMER, "system": "h200_sxm", "backend": "vllm", "tp": 1},
     [("prefill", (4, 1024, 0)), ("prefill", (1, 20000, 0)), ("prefill", (2, 3000, 500)), ("decode", (4, 1025)),
      ("decode", (16, 1100)), ("decode", (7, 131072)), ("fpm", [MIXED])]),
    ({"model": GLIMMER, "system": "h200_sxm", "backend": "sglang", "tp": 2},
     [("prefill", (1, 8192, 0)), ("decode", (64, 4097)), ("fpm", [MIXED])]),
    ({"model": GLIMMER, "system": "b200_sxm", "backend": "trtllm", "tp": 4},
     [("prefill", (4, 777, 0)), ("prefill", (1, 20000, 0)), ("decode", (33, 5000))]),
    ({"model": GLIMMER, "system": "gb200", "backend": "vllm", "tp": 8},
     [("prefill", (2, 2500, 700)), ("decode", (256, 8000))]),
    # SGLang prefill context parallelism: zigzag attention split and every layer's KV all-gather.
    ({"model": GLIMMER, "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2},
     [("prefill", (1, 8192, 0)), ("prefill", (2, 2500, 700)), ("decode", (16, 1100))]),
]
GLIMMER_KV = [
    (GLIMMER, "h200_sxm", "vllm", dict(tp_size=1), 64),
    (GLIMMER, "h200_sxm", "sglang", dict(tp_size=2), 1),
    (GLIMMER, "b200_sxm", "trtllm", dict(tp_size=4), 32),
    (GLIMMER, "gb200", "vllm", dict(tp_size=8), 64),
    (GLIMMER, "h200_sxm", "sglang", dict(tp_size=1, cp_size=2), 1),
]


# SGLang prefill context parallelism on the MLA family (`--mla-cp`): the fused module's layers shared
# by the CP ranks (the granular chain's context kernel split zigzag), the latent-KV all-gather, the
# dispatch's gather of the split prompt; pipeline hand-offs of the whole prompt; a decode step's
# combine all-reduced over the CP ranks.
MLA_CP_STEPS = [
    ({"model": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "backend": "sglang", "tp": 1, "pp": 2, "cp_size": 4,
      "moe_tp_size": 1, "moe_ep_size": 4},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("prefill", (3, 33000, 0)), ("prefill", (1, 1001, 0)),
      ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "moonshotai/Kimi-K2.5", "system": "h200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2,
      "moe_tp_size": 1, "moe_ep_size": 2, "nextn": 1},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("prefill", (3, 33000, 0)), ("prefill", (1, 1001, 0)),
      ("decode", (16, 1100)), ("fpm", [MIXED])]),
    ({"model": "nvidia/DeepSeek-V3.1-NVFP4", "system": "b200_sxm", "backend": "sglang", "tp": 1, "cp_size": 2,
      "moe_tp_size": 1, "moe_ep_size": 2},
     [("prefill", (1, 1024, 0)), ("prefill", (2, 2500, 700)), ("prefill", (3, 33000, 0)), ("prefill", (1, 1001, 0)),
      ("decode", (16, 1100)), ("fpm", [MIXED])]),
]
MLA_CP_KV = [
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", dict(tp_size=1, cp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
    ("moonshotai/Kimi-K2.5", "h200_sxm", "sglang", dict(tp_size=1, cp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
]

KV = [
    ("Qwen/Qwen3-32B", "h200_sxm", "vllm", dict(tp_size=2), 64),
    ("Qwen/Qwen3-8B", "h100_sxm", "vllm", dict(tp_size=1), 64),
    ("Qwen/Qwen3-32B", "h200_sxm", "sglang", dict(tp_size=2), 1),
    ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "vllm", dict(tp_size=4), 16),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "vllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 64),
    ("Qwen/Qwen3-235B-A22B", "h200_sxm", "sglang", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 1),
    ("Qwen/Qwen3-30B-A3B-FP8", "h100_sxm", "vllm", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 16),
    ("openai/gpt-oss-20b", "h100_sxm", "vllm", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 16),
    ("MiniMaxAI/MiniMax-M2.7", "h200_sxm", "vllm", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 64),
    ("Qwen/Qwen3-32B-FP8-Static-PerTensor", "h200_sxm", "vllm", dict(tp_size=1), 64),
    ("nvidia/Qwen3-235B-A22B-NVFP4", "b200_sxm", "vllm", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 64),
    ("nvidia/DeepSeek-V3.1-NVFP4", "b200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
    ("moonshotai/Kimi-K2.5", "h200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
    ("moonshotai/Kimi-K2.5", "h200_sxm", "sglang", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
    ("nvidia/Kimi-K2.7-Code-NVFP4", "b200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
    ("deepseek-ai/DeepSeek-V3.2", "h200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
    ("nvidia/DeepSeek-V3.2-NVFP4", "b200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
    ("nvidia/GLM-5.2-NVFP4", "b200_sxm", "sglang", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
    ("google/gemma-4-26B-A4B", "h200_sxm", "vllm", dict(tp_size=1, moe_tp_size=1, moe_ep_size=1), 64),
    ("google/gemma-4-26B-A4B", "h200_sxm", "sglang", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 1),
    ("nvidia/Gemma-4-26B-A4B-NVFP4", "b200_sxm", "vllm", dict(tp_size=2, moe_tp_size=2, moe_ep_size=1), 64),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "h200_sxm", "vllm", dict(tp_size=2, moe_tp_size=1, moe_ep_size=2), 64),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "h200_sxm", "sglang",
     dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 1),
    ("XiaomiMiMo/MiMo-V2-Flash", "h200_sxm", "vllm", dict(tp_size=4, moe_tp_size=4, moe_ep_size=1), 64),
    ("MiniMaxAI/MiniMax-M3", "h200_sxm", "vllm", dict(tp_size=8, moe_tp_size=1, moe_ep_size=8), 64),
]


DSV4_LENGTHS = [0, 1, 3, 4, 127, 128, 129, 1000, 4096, 100000]
DSV4_BUDGETS = [1e6, 5e9, 60.5e9]


def dsv4_kv():
    from aisimulate_core.sdk import common
    from aisimulate_core.sdk.models.deepseek_v4 import DeepSeekV4Model
    from aisimulate_core.sdk.utils import _load_pre_downloaded_hf_config, _parse_hf_config_json

    for hf in ["deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"]:
        info = _parse_hf_config_json(_load_pre_downloaded_hf_config(hf))
        for kv in ["fp8", "bfloat16"]:
            # The two methods read only these attributes of a built model.
            m = types.SimpleNamespace(
                extra_params=info["extra_params"], _compress_ratios=info["extra_params"].compress_ratios,
                _context_length=info["context"],
                config=types.SimpleNamespace(kvcache_quant_mode=common.KVCacheQuantMode[kv]))
            m.get_kvcache_bytes_per_sequence = lambda s, m=m: DeepSeekV4Model.get_kvcache_bytes_per_sequence(m, s)
            print(json.dumps({"model": hf, "kv": kv, "context": info["context"],
                              "bytes": [(n, m.get_kvcache_bytes_per_sequence(n)) for n in DSV4_LENGTHS],
                              "tokens": [(b, DeepSeekV4Model._binary_search_kvcache_max_tokens(m, b))
                                         for b in DSV4_BUDGETS]}))

VISION_CASES = [("Qwen/Qwen3-VL-8B-Instruct", 1, 1, 1024, 1024), ("Qwen/Qwen3-VL-30B-A3B-Instruct", 2, 4, 720, 1280)]


def vision():
    from aisimulate.sdk.sweep import _vision_encoder_config
    from aisimulate_core.sdk import config
    from aisimulate_core.sdk.backends.factory import get_backend
    from aisimulate_core.sdk.models.blocks.vit import EncoderOnlyModel, build_encoder_ops
    from aisimulate_core.sdk.perf_database import get_database_view

    db = get_database_view("h200_sxm", "vllm", "0.24.0", database_mode="SILICON")
    backend = get_backend("vllm")
    for hf, tp, batch, height, width in VISION_CASES:
        enc = _vision_encoder_config(hf)
        rt = config.RuntimeConfig(isl=1024, osl=128, image_height=height, image_width=width, num_images_per_request=1)
        ops = build_encoder_ops(enc, tp, enable_encoder_dp=False)
        model = EncoderOnlyModel(encoder_ops=ops, encoder_config=enc,
                                 config=config.ModelConfig(tp_size=tp, enable_encoder_dp=False))
        latency, _, _, tokens = backend._run_encoder_phase(model, db, rt, batch)
        _, _, memory, _ = backend.run_encoder_static(model, db, rt, batch)
        print(json.dumps({"model": hf, "tp": tp, "batch": batch, "image": [height, width], "tokens": tokens,
                          "ops": list(latency.items()), "memory_gib": memory["total"]}))


LLAMA4_IMAGES = [(480, 640), (300, 300), (336, 336), (337, 336), (1080, 1920), (4000, 300), (100, 5000), (2000, 2000),
                 (1, 1), (720, 1280)]


def llama4_tiles():
    from aisimulate_core.sdk.backends.base_backend import image_geometry

    for h, w in LLAMA4_IMAGES:
        g = image_geometry("meta-llama/Llama-4-Scout-17B-16E-Instruct", h, w)
        print(json.dumps({"image": [h, w], "sequences": g.sequences, "patch": g.patch_tokens,
                          "transformer": g.transformer_tokens, "output": g.output_tokens,
                          "visual": g.visual_tokens, "embedding_bytes": g.embedding_bytes}))


KIMI_IMAGES = [(720, 1280), (448, 448), (4000, 3000), (1, 1), (100, 7000), (7000, 7000)]
KIMI_OPS = [(1, 1, 720, 1280), (2, 3, 720, 1280)]


def kimi_k3_tower():
    from aisimulate_core.sdk import config
    from aisimulate_core.sdk.backends.base_backend import BaseBackend
    from aisimulate_core.sdk.backends.factory import get_backend
    from aisimulate_core.sdk.models.blocks.vit import EncoderOnlyModel, build_kimi_k3_encoder_ops
    from aisimulate_core.sdk.perf_database import get_database_view
    from aisimulate_core.sdk.utils import get_model_config_from_model_path, get_vision_encoder_config_from_model_info

    enc = get_vision_encoder_config_from_model_info(get_model_config_from_model_path("moonshotai/Kimi-K3"))
    for h, w in KIMI_IMAGES:
        rt = config.RuntimeConfig(image_height=h, image_width=w, num_images_per_request=1)
        try:
            g = BaseBackend._encoder_workload_per_visual(rt, enc)
            print(json.dumps({"image": [h, w], "patches": g.patch_tokens_per_sequence, "tokens": g.output_tokens_per_image}))
        except ValueError as e:
            print(json.dumps({"image": [h, w], "error": str(e)}))
    db = get_database_view("b300_sxm", "sglang", "0.5.14", database_mode="SILICON")
    backend = get_backend("sglang")
    for tp, batch, h, w in KIMI_OPS:
        ops = [o for o in build_kimi_k3_encoder_ops(enc, tp, enable_encoder_dp=False)
               if type(o).__name__ != "EncoderAttention"]
        model = EncoderOnlyModel(encoder_ops=ops, encoder_config=enc,
                                 config=config.ModelConfig(tp_size=tp, enable_encoder_dp=False))
        rt = config.RuntimeConfig(isl=1024, osl=128, image_height=h, image_width=w, num_images_per_request=1)
        latency, _, _, _ = backend._run_encoder_phase(model, db, rt, batch)
        _, _, memory, _ = backend.run_encoder_static(model, db, rt, batch)
        print(json.dumps({"tp": tp, "batch": batch, "image": [h, w], "ops": list(latency.items()),
                          "memory_gib": memory["total"]}))


def main():
    if "--kimi-k3-tower" in sys.argv[1:]:
        kimi_k3_tower()
        return
    if "--llama4-tiles" in sys.argv[1:]:
        llama4_tiles()
        return
    if "--vision" in sys.argv[1:]:
        vision()
        return
    if "--dsv4-kv" in sys.argv[1:]:
        dsv4_kv()
        return
    if "--dsv4" in sys.argv[1:]:
        print_steps(DSV4_STEPS)
        print_kv(DSV4_KV)
        return
    if "--dsv4-sglang" in sys.argv[1:]:
        print_steps(DSV4_SGLANG_STEPS)
        print_kv(DSV4_SGLANG_KV)
        return
    if "--nemotron-h" in sys.argv[1:]:
        print_steps(NEMOTRON_H_STEPS)
        print_kv(NEMOTRON_H_KV)
        return
    if "--qwen35-dp" in sys.argv[1:]:
        print_steps(QWEN35_DP_STEPS)
        return
    if "--qwen35" in sys.argv[1:]:
        print_steps(QWEN35_STEPS)
        print_kv(QWEN35_KV)
        return
    if "--kimi-k3" in sys.argv[1:]:
        print_steps(KIMI_K3_STEPS)
        print_kv(KIMI_K3_KV)
        print_steps(KIMI_K3_SPEC_STEPS)
        print_kv(KIMI_K3_SPEC_KV)
        return
    if "--qwen3vl" in sys.argv[1:]:
        print_steps(QWEN3VL_STEPS)
        print_kv(QWEN3VL_KV)
        return
    if "--glimmer" in sys.argv[1:]:
        print_steps(GLIMMER_STEPS)
        print_kv(GLIMMER_KV)
        return
    if "--mla-cp" in sys.argv[1:]:
        print_steps(MLA_CP_STEPS)
        print_kv(MLA_CP_KV)
        return
    if "--dsv41" in sys.argv[1:]:
        print_steps(DSV41_STEPS)
        return
    if "--msa-nvfp4" in sys.argv[1:]:
        print_steps(MSA_NVFP4_STEPS)
        print_kv(MSA_NVFP4_KV)
        return
    print_steps(STEPS)
    print_kv(KV)


def print_steps(steps):
    for cfg, queries in steps:
        m = RustForwardPassPerfModel.best_available({**cfg, "worker_type": "aggregated"})
        for kind, q in queries:
            if kind == "prefill":
                ops = m.static_phase_diagnostics(batch_size=q[0], context_length=q[1], prefill=True, prefix=q[2])
                v = sum(o["latency_ms"] for o in ops)
            elif kind == "decode":
                ops = m.static_phase_diagnostics(batch_size=q[0], context_length=q[1] - 1, prefill=False)
                v = sum(o["latency_ms"] for o in ops)
            elif kind == "timer_prefill":
                b, isl, pre = q
                v = m.estimate_forward_pass_time_ms({"scheduled_requests": {
                    "num_prefill_requests": b, "sum_prefill_tokens": b * (isl - pre), "sum_prefill_kv_tokens": b * pre}})
            elif kind == "timer_decode":
                b, c = q
                v = m.estimate_forward_pass_time_ms({"scheduled_requests": {
                    "num_decode_requests": b, "sum_decode_kv_tokens": b * (c + 1)}})
            else:
                v = max(m.estimate_forward_pass_time_ms({"scheduled_requests": r}) for r in q)
            print(json.dumps({"cfg": cfg, "kind": kind, "q": q, "ms": repr(v)}))


def print_kv(kv):
    for model, system, backend, par, block in kv:
        frac = 0.88 if backend == "sglang" else 0.9
        kind = "of_free" if backend == "trtllm" else "of_total"  # TRT-LLM's fraction is of the free memory
        r = estimate_num_gpu_blocks(model, system, backend, scheduler_block_size=block, max_num_tokens=8192,
                                    max_batch_size=256, memory_fraction_kind=kind, memory_fraction_value=frac, **par)
        print(json.dumps({"kv": [model, system, backend, par, block], "blocks": r}, default=str))


if __name__ == "__main__":
    main()
