#!/usr/bin/env python3
"""SGLang's `engine.moe_backend` override, probed through both tools (crates/perf/src/eplb.rs).

    python3 scripts/moe_backend_probe.py --binary target/release/servesim [--models SUBSTR,...]

For each MoE model below (h200_sxm unless it names hardware, SGLang 0.5.14, one aggregated
replica at the layout given, AIS timing, 24 requests of 2048 / 128 tokens at concurrency 8) runs
aisimulate 0.13's predict (`$AISIM_REF_VENV`, via ../shared/parity/aisimulate_predict.py) without
the key and with `deepep_moe` and `megamoe`, and servesim's `predict -c` with each value. Prints per (model, value)
whether the reference's run equals its default run in mean / p90 TTFT, mean ITL and mean E2E,
and servesim's worst relative deviation from the reference's run (or both tools' refusals).
Reference results are not cached: about 10 s a run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = [  # (model, tensor, attention_data, moe_expert[, hardware, default h200_sxm])
    ("Qwen/Qwen3-30B-A3B", 1, 2, 2),
    ("Qwen/Qwen3-30B-A3B", 2, 1, 2),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", 1, 2, 2),
    ("openai/gpt-oss-20b", 1, 2, 2),
    ("MiniMaxAI/MiniMax-M2.7", 1, 4, 4),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 1, 2, 2),
    ("google/gemma-4-26B-A4B", 1, 2, 2),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 1, 2, 2),
    ("XiaomiMiMo/MiMo-V2-Flash", 1, 4, 4),
    ("deepseek-ai/DeepSeek-V3", 1, 8, 8),
    ("deepseek-ai/DeepSeek-V3.2", 1, 8, 8),
    ("moonshotai/Kimi-K2.5", 1, 8, 8),
    ("zai-org/GLM-5.2-FP8", 1, 8, 8),
    ("Qwen/Qwen3.5-35B-A3B", 1, 2, 2),
    # DeepSeek-V4 (dsv4_sglang.rs): deepep_moe builds the default graph; megamoe fails in both
    # tools (no dsv4_megamoe_module_perf at any served version). Its fp4 checkpoints run on B200.
    ("sgl-project/DeepSeek-V4-Flash-FP8", 1, 4, 4),
    ("deepseek-ai/DeepSeek-V4-Flash", 1, 4, 4, "b200_sxm"),
    ("deepseek-ai/DeepSeek-V4-Pro", 1, 8, 8, "b200_sxm"),
]
METRICS = ["mean_ttft_ms", "p90_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms"]
HERE = os.path.dirname(os.path.abspath(__file__))


def config(model, tp, adp, ep, value, hardware="h200_sxm"):
    backend = "" if value is None else f"\n  moe_backend: {value}"
    return f"""traffic:
  source: {{type: synthetic, input_tokens: 2048, output_tokens: 128}}
  load: {{type: concurrency, concurrency: 8}}
  stop: {{requests: 24}}
engine:
  mode: aggregated
  model: {model}
  hardware: {hardware}
  backend: sglang{backend}
  workers:
    aggregated:
      parallelism: {{replicas: 1, tensor: {tp}, attention_data: {adp}, moe_expert: {ep}}}
      timing: {{type: default}}
"""


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, last[:160]
    return json.loads(r.stdout), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "target", "release", "servesim"))
    ap.add_argument("--models", help="comma-separated substrings of the model names")
    a = ap.parse_args()
    venv = os.environ.get("AISIM_REF_VENV", "/tmp/servesim-aisim-ref")
    ref_script = os.path.join(HERE, "..", "..", "shared", "parity", "aisimulate_predict.py")
    wanted = a.models.split(",") if a.models else None
    with tempfile.TemporaryDirectory() as tmp:
        for model, tp, adp, ep, *hw in MODELS:
            if wanted and not any(w in model for w in wanted):
                continue
            runs = {}
            for value in (None, "deepep_moe", "megamoe"):
                path = os.path.join(tmp, "cfg.yaml")
                with open(path, "w") as f:
                    f.write(config(model, tp, adp, ep, value, *hw))
                ref = run([os.path.join(venv, "bin", "python"), ref_script, path])
                ours = run([a.binary, "predict", "-c", path, "--output-dir", os.path.join(tmp, "out"),
                            "--overwrite", "--format", "json"])
                runs[value] = (ref, ours)
            base = runs[None][0][0]
            for value in ("deepep_moe", "megamoe"):
                (ref, ref_err), (ours, ours_err) = runs[value]
                label = f"{model} TP{tp} ADP{adp} EP{ep} {value}"
                if ref is None or ours is None:
                    print(f"{label}: reference {'refuses: ' + ref_err if ref is None else 'runs'}; "
                          f"servesim {'refuses: ' + ours_err if ours is None else 'runs'}")
                    continue
                same = base is not None and all(ref[k] == base[k] for k in METRICS)
                worst = max(abs(ours[k] - ref[k]) / abs(ref[k]) for k in METRICS if ref.get(k))
                print(f"{label}: reference equal to its default run: {same}; servesim worst {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
