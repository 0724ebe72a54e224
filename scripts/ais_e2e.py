#!/usr/bin/env python3
"""End to end: `servesim predict` with the AIS timing model vs Dynamo 1.6.1's replay, both given
the engine-JSON spelling `timing_model: {"type": "external", "provider": "ais", "config": ...}` (Qwen3-32B, and the
mixture-of-experts Qwen3-30B-A3B at tp 2 with moe_ep 2).

    python3 scripts/ais_e2e.py [--dyn-python /tmp/servesim-aisim-dyn/bin/python]
                               [--servesim target/release/servesim] [--replay ../shared/parity/dynamo_replay.py]

servesim reads the data of the same aisimulate_core the reference venv has (its systems/
directory is found through the venv's python and passed as SERVESIM_AIS_SYSTEMS), so each
side uses its own reference's data. Prints mean TTFT / ITL / E2E and output throughput side by
side; exit status 1 when any differs by more than 2 %.

Router cases (`router_*`) check the KV router's prompt-side load model: servesim's
`--router-prefill-load-model ais` against Dynamo's replay with `router_prefill_load_model: "ais"`
and the same `ais_perf_config` (the replay API's separate estimator identity; the shared
dynamo_replay.py does not pass it, so this script runs its own small runner). The trace has
varied prompt lengths over 3 workers. Dynamo breaks exact cost ties at random without a fixed
seed, so its own results vary from run to run: the reference runs --router-runs times and
servesim is compared with their mean (their spread is printed). The `none` case is the control.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

MODEL = "Qwen/Qwen3-32B"


MOE_MODEL = "Qwen/Qwen3-30B-A3B"


def timing(backend, worker_type, tp=2, model=MODEL, **extra):
    return {"type": "external", "provider": "ais",
            "config": {"model": model, "system": "h200_sxm", "backend": backend, "worker_type": worker_type, "tp": tp, **extra}}


def engine(backend, worker_type="aggregated", **timing_args):
    e = {"backend": backend, "block_size": 64 if backend == "vllm" else 1, "num_gpu_blocks": 20000 if backend == "vllm" else 1280000,
         "max_num_seqs": 256, "max_num_batched_tokens": 8192, "timing_model": timing(backend, worker_type, **timing_args)}
    if worker_type != "aggregated":
        e["worker_type"] = worker_type
    return e


SYN = {"input_tokens": 1024, "output_tokens": 128, "request_count": 200, "request_rate": 8.0, "arrival_seed": 42}
CASES = {
    "agg_vllm": {"synthetic": SYN, "engine": engine("vllm"), "num_workers": 1},
    "agg_sglang": {"synthetic": SYN, "engine": engine("sglang"), "num_workers": 1},
    "disagg_vllm": {"synthetic": {**SYN, "input_tokens": 3000, "output_tokens": 200},
                    "prefill_engine": engine("vllm", "prefill"), "decode_engine": engine("vllm", "decode"),
                    "num_prefill_workers": 1, "num_decode_workers": 2},
    "disagg_sglang": {"synthetic": {**SYN, "input_tokens": 3000, "output_tokens": 200},
                      "prefill_engine": engine("sglang", "prefill"), "decode_engine": engine("sglang", "decode"),
                      "num_prefill_workers": 1, "num_decode_workers": 2},
    # Mixture of experts: Qwen3-30B-A3B with its experts split by expert parallelism.
    "agg_vllm_moe": {"synthetic": {**SYN, "request_rate": 16.0},
                     "engine": engine("vllm", model=MOE_MODEL, moe_tp_size=1, moe_ep_size=2), "num_workers": 1},
}
METRICS = ["mean_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms", "output_throughput_tok_s"]

ROUTER_AIS = {"model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated", "tp": 1}
ROUTER_ENGINE = {"backend": "vllm", "block_size": 64, "num_gpu_blocks": 20000, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                 "timing_model": {"type": "external", "provider": "ais", "config": ROUTER_AIS}}
ROUTER_CASES = {"router_ais": "ais", "router_none": "none"}

ROUTER_RUNNER = """
import json, os, sys
os.environ.setdefault("RUST_LOG", "error")
from dynamo.replay.api import run_trace_replay
from dynamo._core import AisPerfConfig, KvRouterConfig
case = json.load(open(sys.argv[1]))
kw = {"ais_perf_config": AisPerfConfig(case["ais_perf_config"])} if case.get("ais_perf_config") else {}
rep = run_trace_replay([case["trace"]], trace_format="mooncake", trace_block_size=512,
                       extra_engine_args={"engine": case["engine"]}, router_config=KvRouterConfig(**case["router_config"]),
                       num_workers=case["num_workers"], router_mode="kv_router", **kw)
print(json.dumps(dict(rep.summary)))
"""


def write_router_trace(path, requests=400, rate=14.0, seed=7):
    """Poisson arrivals, prompts of 500-7000 tokens (no shared blocks), 20-200 output tokens."""
    rng = random.Random(seed)
    t, next_hash = 0.0, 0
    with open(path, "w") as f:
        for _ in range(requests):
            t += rng.expovariate(rate) * 1000
            isl, osl = rng.randint(500, 7000), rng.randint(20, 200)
            n = (isl + 511) // 512
            f.write(json.dumps({"timestamp": round(t, 3), "input_length": isl, "output_length": osl,
                                "hash_ids": list(range(next_hash, next_hash + n))}) + "\n")
            next_hash += n


def router_case(name, model, a, env):
    """Returns (reference mean summary, spread per metric, servesim summary) or raises."""
    with tempfile.TemporaryDirectory() as d:
        trace, runner = os.path.join(d, "trace.jsonl"), os.path.join(d, "runner.py")
        write_router_trace(trace)
        open(runner, "w").write(ROUTER_RUNNER)
        case = {"trace": trace, "engine": ROUTER_ENGINE, "num_workers": 3, "router_config": {"router_prefill_load_model": model}}
        if model == "ais":
            case["ais_perf_config"] = ROUTER_AIS
        cp = os.path.join(d, "case.json")
        json.dump(case, open(cp, "w"))
        refs = []
        for _ in range(a.router_runs):
            r = subprocess.run([a.dyn_python, runner, cp], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"reference failed: {r.stderr.strip()[-400:]}")
            refs.append(json.loads(r.stdout))
        ep = os.path.join(d, "engine.json")
        json.dump({"engine": ROUTER_ENGINE}, open(ep, "w"))
        s = subprocess.run([a.servesim, "predict", trace, "--extra-engine-args", ep, "--num-workers", "3",
                            "--router-mode", "kv_router", "--router-prefill-load-model", model, "--format", "json"],
                           capture_output=True, text=True, env=env)
        if s.returncode != 0:
            raise RuntimeError(f"servesim failed: {s.stderr.strip()[-400:]}")
        ours = json.loads(s.stdout)
    mean = {m: sum(r[m] for r in refs) / len(refs) for m in METRICS}
    spread = {m: (min(r[m] for r in refs), max(r[m] for r in refs)) for m in METRICS}
    return mean, spread, ours


def servesim_args(case, d):
    s = case["synthetic"]
    args = ["predict", "--input-tokens", str(s["input_tokens"]), "--output-tokens", str(s["output_tokens"]),
            "--request-count", str(s["request_count"]), "--request-rate", str(s["request_rate"]),
            "--arrival-seed", str(s["arrival_seed"]), "--format", "json"]
    for key, flag in [("engine", "--extra-engine-args"), ("prefill_engine", "--prefill-engine-args"),
                      ("decode_engine", "--decode-engine-args")]:
        if key in case:
            p = os.path.join(d, key + ".json")
            json.dump({"engine": case[key]}, open(p, "w"))
            args += [flag, p]
    for key, flag in [("num_workers", "--num-workers"), ("num_prefill_workers", "--num-prefill-workers"),
                      ("num_decode_workers", "--num-decode-workers")]:
        if key in case:
            args += [flag, str(case[key])]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dyn-python", default=os.environ.get("AISIM_DYN_VENV", "/tmp/servesim-aisim-dyn") + "/bin/python")
    ap.add_argument("--servesim", default="target/release/servesim")
    ap.add_argument("--replay", default="../shared/parity/dynamo_replay.py")
    ap.add_argument("--cases", default=",".join([*CASES, *ROUTER_CASES]))
    ap.add_argument("--router-runs", type=int, default=5, help="reference runs per router case (random tie-breaks)")
    a = ap.parse_args()
    systems = subprocess.run([a.dyn_python, "-c", "import aisimulate_core, os; print(os.path.join(os.path.dirname(aisimulate_core.__file__), 'systems'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "SERVESIM_AIS_SYSTEMS": systems}
    worst = 0.0
    for name in a.cases.split(","):
        if name in ROUTER_CASES:
            try:
                mean, spread, ours = router_case(name, ROUTER_CASES[name], a, env)
            except RuntimeError as e:
                print(f"{name}: {e}")
                worst = float("inf")
                continue
            print(f"{name}: reference mean of {a.router_runs} runs (min-max), servesim")
            for m in METRICS:
                rv, sv = mean[m], ours[m]
                d = abs(sv - rv) / abs(rv)
                worst = max(worst, d)
                print(f"  {m:<26} reference {rv:>12.4f} ({spread[m][0]:.4f}-{spread[m][1]:.4f})  servesim {sv:>12.4f}  diff {100 * d:7.3f} %")
            continue
        case = CASES[name]
        with tempfile.TemporaryDirectory() as d:
            cp = os.path.join(d, "case.json")
            json.dump(case, open(cp, "w"))
            r = subprocess.run([a.dyn_python, a.replay, cp], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: reference failed: {r.stderr.strip()[-400:]}")
                worst = float("inf")
                continue
            ref = json.loads(r.stdout)
            started = time.monotonic()
            s = subprocess.run([a.servesim] + servesim_args(case, d), capture_output=True, text=True, env=env)
            ours_wall_ms = 1000 * (time.monotonic() - started)
            if s.returncode != 0:
                print(f"{name}: servesim failed: {s.stderr.strip()[-400:]}")
                worst = float("inf")
                continue
            ours = json.loads(s.stdout)
        print(f"{name}: completed reference {ref.get('completed_requests')} servesim {ours.get('completed_requests')}; "
              f"wall reference {ref.get('call_wall_ms', 0):.0f} ms (the replay call), servesim {ours_wall_ms:.0f} ms "
              f"(the whole process, AIS tables loaded), {ref.get('call_wall_ms', 0) / ours_wall_ms:.1f}x")
        for m in METRICS:
            rv, sv = ref.get(m), ours.get(m)
            d = abs(sv - rv) / abs(rv) if rv else float("nan")
            worst = max(worst, d)
            print(f"  {m:<26} reference {rv:>12.4f}  servesim {sv:>12.4f}  diff {100 * d:7.3f} %")
    print(f"worst difference: {100 * worst:.3f} %")
    sys.exit(0 if worst <= 0.02 else 1)


if __name__ == "__main__":
    main()
