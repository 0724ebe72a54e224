#!/usr/bin/env python3
"""Compare servesim's AIS timing model with the reference estimator on a grid of shapes.

Run with the aisimulate reference venv's python (it has aisimulate_core):

    $AISIM_REF_VENV/bin/python scripts/ais_parity.py [--servesim target/release/servesim] [--quick]

For each (model, system, backend, tp) it builds the reference `RustForwardPassPerfModel`
(`best_available`, op-level) and asks it, for every shape, the same thing servesim's timing
provider computes:
  prefill  -> static_phase_diagnostics(batch, isl, prefix, prefill=True), summed
  decode   -> static_phase_diagnostics(batch, context - 1, prefill=False), summed (one step)
  mixed    -> estimate_forward_pass_time_ms({prefill + decode} FPM)
and runs `servesim perf --queries -` on the same list. Prints both side by side and a summary
(shapes within 1 % / 3 %, worst shapes). Exit status 1 when the targets (>= 99 % within 1 %,
all within 3 %) are missed, or when only one side refuses a shape.

Mixture-of-experts models run at every tp with the experts split by tensor parallelism
(moe_tp = tp) and by expert parallelism (moe_ep = tp), plus attention-DP layouts
(`--moe-dp`). MLA models (DeepSeek-V3 / R1) run on one 8-GPU node of `--mla-systems`: TP8 with
moe_tp 8 or moe_ep 8, and attention DP 2 / 4 / 8 over moe_ep 8. Models the reference only knows by Hugging Face id but does not ship in its
DefaultHFModels list (Mixtral) are passed to both sides as a local directory holding the
packaged config.json. `--pps` / `--cps` run every layout also at those pipeline depths (`pp`) and
prefill context-parallel sizes (`cp_size`; the reference allows it on SGLang at tp 1 only).
`--database-mode SOL` asks both sides for the speed-of-light rooflines instead of the measured
tables (the `database_mode` config key); those agree to rounding, so compare with `--tol 1e-6`.
`--database-mode EMPIRICAL` / `HYBRID` likewise (dense models; servesim refuses MoE / MLA /
DSA / MSA under them by name, so those show as "only one side refuses").
"""
import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

import aisimulate_core
from aisimulate_core.sdk import RustForwardPassPerfModel

SYSTEMS = os.path.join(os.path.dirname(aisimulate_core.__file__), "systems")

DENSE = ["Qwen/Qwen3-32B", "Qwen/Qwen3-8B", "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-70B",
         # static per-tensor FP8 (ModelOpt)
         "Qwen/Qwen3-32B-FP8-Static-PerTensor", "nvidia/Llama-3.1-70B-Instruct-FP8"]
MOE = ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-20b", "Qwen/Qwen3-30B-A3B-FP8",
       "mistralai/Mixtral-8x7B-v0.1", "MiniMaxAI/MiniMax-M2.7",
       # Gemma 4 (GEMMA4MIX): sliding-window / global layers, dense MLP beside routed experts
       "google/gemma-4-26B-A4B"]
# Multi-head latent attention + MoE (DeepSeek-V3 family): 8-GPU layouts on their own systems.
# moonshotai/Kimi-K2.5: the KimiK25ForConditionalGeneration wrapper (text model under
# text_config), compressed-tensors INT4 routed experts.
MLA = ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "moonshotai/Kimi-K2-Instruct", "moonshotai/Kimi-K2.5"]
# NVFP4 (ModelOpt) checkpoints: fp4 tensor cores, so Blackwell systems only (`--fp4-systems`).
NVFP4_MOE = ["nvidia/Qwen3-235B-A22B-NVFP4", "nvidia/MiniMax-M2.7-NVFP4", "nvidia/Gemma-4-26B-A4B-NVFP4"]
# Dense NVFP4 checkpoints (Gemma-4-31B: the attention projections kept in bf16).
NVFP4_DENSE = ["nvidia/Gemma-4-31B-IT-NVFP4"]
NVFP4_MLA = ["nvidia/DeepSeek-V3.1-NVFP4", "nvidia/Kimi-K2.5-NVFP4", "nvidia/Kimi-K2.6-NVFP4",
             "nvidia/Kimi-K2.7-Code-NVFP4"]
# DeepSeek sparse attention (DeepSeek-V3.2, GLM-5.x): one 8-GPU node like the MLA models; the
# NVFP4 ones on `--fp4-systems`.
DSA = ["deepseek-ai/DeepSeek-V3.2", "zai-org/GLM-5.2-FP8"]
NVFP4_DSA = ["nvidia/DeepSeek-V3.2-NVFP4", "nvidia/GLM-5.2-NVFP4"]
# Local / global attention with MoE and dense layers (the reference's HYBRIDMOE family): laid out
# like the MoE models. Llama-4 is the text model of a vision wrapper.
HYBRID = ["meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
          "XiaomiMiMo/MiMo-V2-Flash"]
# MiniMax sparse attention (MiniMax-M3): one 8-GPU node like DSA; the NVFP4 release (a multimodal
# wrapper, text model under text_config) on `--fp4-systems`.
MSA = ["MiniMaxAI/MiniMax-M3"]
NVFP4_MSA = ["nvidia/MiniMax-M3-NVFP4"]
# Not in the reference's DefaultHFModels: both sides read a local copy of the packaged config.
LOCAL = {"mistralai/Mixtral-8x7B-v0.1", "moonshotai/Kimi-K2-Instruct"}


def shapes(quick):
    """(kind, query) pairs: exact grid points, in-grid interpolation and out-of-range."""
    out = []
    # prefill: batch, isl, prefix
    for b, isl, pre in [(1, 128, 0), (1, 1024, 0), (1, 1000, 0), (2, 3000, 0), (4, 777, 0), (1, 8192, 0),
                        (1, 16384, 0), (1, 20000, 0), (8, 2048, 0), (16, 512, 0), (1, 4096, 1024),
                        (2, 2500, 700), (64, 100, 0), (3, 33000, 0), (1, 1, 0)][: 8 if quick else None]:
        out.append(("prefill", {"prefill": [b, isl, pre]}))
    # decode: batch, context
    for b, ctx in [(1, 1025), (1, 100), (8, 2048), (16, 1100), (33, 5000), (64, 4097), (128, 1500),
                   (256, 8000), (7, 131072), (512, 300), (3, 200000), (1024, 1024)][: 6 if quick else None]:
        out.append(("decode", {"decode": [b, ctx]}))
    # forward passes (FPM): decode-only, prefill-only, and mixed prefill + decode. `--quick` keeps
    # all of them: a mixed pass splits each model's attention out of its other ops, which neither
    # one-phase pass exercises (DSA / MSA mixed passes once differed unnoticed).
    for r in [
        {"num_decode_requests": 16, "sum_decode_kv_tokens": 16 * 1100},
        {"num_prefill_requests": 1, "sum_prefill_tokens": 1024},
        {"num_prefill_requests": 2, "sum_prefill_tokens": 3000, "sum_prefill_kv_tokens": 500},
        {"num_prefill_requests": 1, "sum_prefill_tokens": 512, "num_decode_requests": 31, "sum_decode_kv_tokens": 31 * 1500},
        {"num_prefill_requests": 3, "sum_prefill_tokens": 2000, "sum_prefill_kv_tokens": 3000,
         "num_decode_requests": 100, "sum_decode_kv_tokens": 100 * 700},
    ]:
        out.append(("fpm", {"ranks": [r]}))
    return out


def layouts(model_name, tps, moe_dp, pps=(1,), cps=(1,)):
    """`layouts_tp` (below) at every pipeline depth of `pps` and prefill context-parallel size
    of `cps` (the defaults: neither, as before); a size of 1 leaves its key out."""
    out = []
    for pp in pps:
        for cp in cps:
            for layout in layouts_tp(model_name, tps, moe_dp):
                out.append({**layout, **({"pp": pp} if pp > 1 else {}), **({"cp_size": cp} if cp > 1 else {})})
    return out


def layouts_tp(model_name, tps, moe_dp):
    """Parallel layouts to compare: dense models by tp; MoE models with the experts split by
    tensor parallelism (moe_tp = tp) and by expert parallelism (moe_ep = tp), plus attention
    data parallelism (attention_dp 2 with moe_ep = 2 · tp) when asked. MLA models on one 8-GPU
    node, whatever `tps` says: TP8 with the experts split by TP or by EP, and attention DP
    2 / 4 / 8 over expert parallelism."""
    if model_name in MLA + NVFP4_MLA + DSA + NVFP4_DSA + MSA + NVFP4_MSA:
        out = [{"tp": 8, "moe_tp_size": 8, "moe_ep_size": 1}, {"tp": 8, "moe_tp_size": 1, "moe_ep_size": 8}]
        if moe_dp:
            out += [{"tp": 8 // dp, "attention_dp": dp, "moe_tp_size": 1, "moe_ep_size": 8} for dp in (2, 4, 8)]
        return out
    out = []
    for tp in tps:
        if model_name not in MOE + NVFP4_MOE + HYBRID:
            out.append({"tp": tp})
            continue
        out.append({"tp": tp, "moe_tp_size": tp, "moe_ep_size": 1})
        if tp > 1:
            out.append({"tp": tp, "moe_tp_size": 1, "moe_ep_size": tp})
        if moe_dp and tp <= 2:
            out.append({"tp": tp, "attention_dp": 2, "moe_tp_size": 1, "moe_ep_size": 2 * tp})
    return out


def label(layout):
    s = f"tp{layout['tp']}"
    if layout.get("attention_dp", 1) > 1:
        s += f" dp{layout['attention_dp']}"
    if "moe_tp_size" in layout:
        s += f" m{layout['moe_tp_size']}x{layout['moe_ep_size']}"
    if layout.get("pp", 1) > 1:
        s += f" pp{layout['pp']}"
    if layout.get("cp_size", 1) > 1:
        s += f" cp{layout['cp_size']}"
    return s


def reference(model, q):
    if "prefill" in q:
        b, isl, pre = q["prefill"]
        # AicTimingModel.predict_prefill_ms: the op evidence of the static context phase.
        ops = model.static_phase_diagnostics(batch_size=b, context_length=isl, prefill=True, prefix=pre)
        return sum(op["latency_ms"] for op in ops)
    if "decode" in q:
        b, ctx = q["decode"]
        # The timing provider's decode step: the op evidence of one static generation step at
        # context_length = context - 1 (AicTimingModel.predict_decode_ms), summed.
        ops = model.static_phase_diagnostics(batch_size=b, context_length=ctx - 1, prefill=False)
        return sum(op["latency_ms"] for op in ops)
    return model.estimate_forward_pass_time_ms({"scheduled_requests": q["ranks"][0]})


def servesim(binary, cfg, queries, systems):
    cmd = [binary, "perf", "--config", json.dumps({**cfg, "systems_paths": [systems]}), "--queries", "-"]
    p = subprocess.run(cmd, input="\n".join(json.dumps(q) for q in queries) + "\n", capture_output=True, text=True)
    if p.returncode != 0:
        return [{"error": p.stderr.strip()}] * len(queries)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servesim", default="target/release/servesim")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(DENSE + MOE + MLA + NVFP4_MOE + NVFP4_MLA + DSA + NVFP4_DSA
                                                 + NVFP4_DENSE + HYBRID + MSA + NVFP4_MSA))
    ap.add_argument("--systems", default="h200_sxm,h100_sxm")
    ap.add_argument("--mla-systems", default="h200_sxm,b200_sxm,gb200",
                    help="systems the MLA models (DeepSeek-V3 family) run on")
    ap.add_argument("--fp4-systems", default="b200_sxm,gb200", help="systems the NVFP4 checkpoints run on")
    ap.add_argument("--backends", default="vllm,sglang")
    ap.add_argument("--tps", default="1,2,4")
    ap.add_argument("--moe-dp", action=argparse.BooleanOptionalAction, default=True,
                    help="also run MoE models with attention data parallelism (attention_dp 2)")
    ap.add_argument("--pps", default="1", help="pipeline-parallel depths (`pp`) to run every layout at")
    ap.add_argument("--cps", default="1", help="prefill context-parallel sizes (`cp_size`) to run every layout at")
    ap.add_argument("--database-mode", default=None, help="database_mode for both sides (SILICON, SOL, EMPIRICAL or HYBRID)")
    ap.add_argument("--tol", type=float, default=None,
                    help="pass only when every shape is within this relative difference (default: the 1 %% / 3 %% targets)")
    ap.add_argument("--json", help="write every row here")
    a = ap.parse_args()
    rows = []
    local_root = tempfile.mkdtemp(prefix="ais_parity_models_")
    atexit.register(shutil.rmtree, local_root, ignore_errors=True)
    for model_name in a.models.split(","):
        model_arg = model_name
        if model_name in LOCAL:
            model_arg = os.path.join(local_root, model_name.replace("/", "--"))
            os.makedirs(model_arg, exist_ok=True)
            shutil.copy(os.path.join(os.path.dirname(SYSTEMS), "model_configs", model_name.replace("/", "--") + "_config.json"),
                        os.path.join(model_arg, "config.json"))
        systems = (a.mla_systems if model_name in MLA + DSA + MSA
                   else a.fp4_systems if model_name in NVFP4_MOE + NVFP4_MLA + NVFP4_DSA + NVFP4_DENSE + NVFP4_MSA
                   else a.systems)
        for system in systems.split(","):
            for backend in a.backends.split(","):
                for layout in layouts(model_name, list(map(int, a.tps.split(","))), a.moe_dp,
                                      list(map(int, a.pps.split(","))), list(map(int, a.cps.split(",")))):
                    tp = layout["tp"]
                    cfg = {"model": model_arg, "system": system, "backend": backend, "worker_type": "aggregated", **layout}
                    if a.database_mode:
                        cfg["database_mode"] = a.database_mode
                    qs = shapes(a.quick)
                    try:
                        ref_model = RustForwardPassPerfModel.best_available(dict(cfg))
                    except Exception as e:  # noqa: BLE001
                        print(f"# reference cannot build {cfg}: {e}", file=sys.stderr)
                        continue
                    ours = servesim(a.servesim, cfg, [q for _, q in qs], SYSTEMS)
                    for (kind, q), o in zip(qs, ours):
                        try:
                            r = reference(ref_model, q)
                            rerr = None
                        except Exception as e:  # noqa: BLE001
                            r, rerr = None, str(e).splitlines()[0][:80]
                        s = o.get("ms")
                        rel = abs(s - r) / r if (r and s is not None) else None
                        rows.append(dict(model=model_name, system=system, backend=backend, tp=tp, layout=label(layout), kind=kind,
                                         query=q, ref=r, ref_error=rerr, servesim=s, error=o.get("error"), rel=rel))
    both_fail = [x for x in rows if x["ref"] is None and x["servesim"] is None]
    compared = [x for x in rows if x["rel"] is not None]
    mismatch = [x for x in rows if (x["ref"] is None) != (x["servesim"] is None)]
    print(f"{'model':<30} {'system':<9} {'be':<6} {'layout':<14} {'kind':<7} {'query':<60} {'reference':>12} {'servesim':>12} {'diff %':>8}")
    for x in rows:
        q = json.dumps(x["query"])[:60]
        ref = f"{x['ref']:.4f}" if x["ref"] is not None else "error"
        ss = f"{x['servesim']:.4f}" if x["servesim"] is not None else "error"
        d = f"{100 * x['rel']:.3f}" if x["rel"] is not None else "-"
        print(f"{x['model']:<30} {x['system']:<9} {x['backend']:<6} {x['layout']:<14} {x['kind']:<7} {q:<60} {ref:>12} {ss:>12} {d:>8}")
    n = len(compared)
    w1 = sum(1 for x in compared if x["rel"] <= 0.01)
    w3 = sum(1 for x in compared if x["rel"] <= 0.03)
    print(f"\nshapes compared: {n}; within 1 %: {w1} ({100 * w1 / max(n, 1):.2f} %); within 3 %: {w3}; "
          f"both refuse: {len(both_fail)}; only one side refuses: {len(mismatch)}")
    for x in sorted(compared, key=lambda x: -x["rel"])[:8]:
        print(f"  worst: {100 * x['rel']:.3f} % {x['model']} {x['system']} {x['backend']} {x['layout']} {json.dumps(x['query'])}")
    for x in mismatch[:10]:
        print(f"  one side refuses: {x['model']} {x['system']} {x['backend']} {x['layout']} {json.dumps(x['query'])} "
              f"ref={x['ref_error'] or x['ref']} servesim={x['error'] or x['servesim']}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    ok = n > 0 and w1 >= 0.99 * n and w3 == n and not mismatch
    if a.tol is not None:
        within = sum(1 for x in compared if x["rel"] <= a.tol)
        print(f"within {a.tol:g}: {within} of {n}")
        ok = n > 0 and within == n and not mismatch
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
