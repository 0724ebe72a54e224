#!/usr/bin/env python3
"""Run one parity case through servesim and (optionally) the reference, and compare.

A case file is the JSON that ../shared/parity/dynamo_replay.py takes ("trace" or "synthetic",
"engine", "num_workers", ...). Paths in a case are relative to the case file.

  scripts/parity.py CASE.json                      # servesim vs the recorded golden summary
  scripts/parity.py CASE.json --reference          # servesim vs a fresh reference run
  scripts/parity.py CASE.json --record             # run the reference, write the golden file

The golden summary of CASE.json is CASE.golden.json next to it. A case whose reference run is
random (KV-router ties, softmax sampling) says so with
  "check": {"runs": 3, "tolerances": {"median_ttft_ms": 0.05, ...}}
its golden file then holds the per-key median of that many reference runs, and only the listed
metrics (plus completed_requests) are compared, each with its own relative tolerance. With
"seeds": n beside "runs", servesim's side is the per-key median over router seeds 42..42+n-1
(a median against a median, rather than one seed against a median).
A case may add "launch": {...}, top-level engine-args keys besides "engine" (the memory
fractions, {"dynamo": {"router_queue_policy": ...}}), and "reference": "dynamo+aisimulate" when
its engine uses AIS timing (recorded with ../shared/parity/setup_aisimulate.sh --with-dynamo).
"""
import argparse, atexit, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
# The metrics compared and their relative tolerances.
TOLERANCES = {
    "duration_ms": 0.02, "mean_ttft_ms": 0.02, "median_ttft_ms": 0.02, "p90_ttft_ms": 0.02,
    "p99_ttft_ms": 0.02, "mean_itl_ms": 0.02, "median_e2e_latency_ms": 0.02,
    "p99_e2e_latency_ms": 0.02, "prefix_cache_reused_ratio": 0.02,
}
EXACT = ["completed_requests"]
# Nested summary sections whose numbers are compared when the golden has them.
SECTIONS = ["g3_offload"]


def resolve(case_path):
    """The case with its trace paths made absolute. `"trace_lines": N` replays only the first N
    lines of the trace (a cut written to a temporary file, so that the shared traces never need
    copying into the repository)."""
    case = json.load(open(case_path))
    base = os.path.dirname(os.path.abspath(case_path))
    if case.get("traces"):
        out = []
        for t in case["traces"]:
            t = t.replace("${SHARED}", SHARED)
            out.append(t if os.path.isabs(t) else os.path.join(base, t))
        case["traces"] = out
    if case.get("trace"):
        t = case["trace"]
        t = t.replace("${SHARED}", SHARED)
        case["trace"] = t if os.path.isabs(t) else os.path.join(base, t)
        lines = case.pop("trace_lines", None)
        if lines is not None:
            cut = os.path.join(tempfile.gettempdir(), f"servesim-parity-{os.getpid()}-{lines}.jsonl")
            with open(case["trace"]) as src, open(cut, "w") as dst:
                for _, line in zip(range(lines), src):
                    dst.write(line)
            atexit.register(lambda: os.path.exists(cut) and os.unlink(cut))
            case["trace"] = cut
    # A profile NPZ named by an engine's timing model (Dynamo's `dynamo_profile` form) is
    # relative to the case file.
    for role in ("engine", "prefill_engine", "decode_engine"):
        timing = (case.get(role) or {}).get("timing_model") or {}
        config = timing.get("config") if timing.get("provider") == "dynamo_profile" else None
        if isinstance(config, dict) and isinstance(config.get("path"), str) and not os.path.isabs(config["path"]):
            config["path"] = os.path.join(base, config["path"])
    # A router policy file named in the router configuration is relative to the case file.
    rc = case.get("router_config") or {}
    if rc.get("router_policy_config") and not os.path.isabs(rc["router_policy_config"]):
        rc["router_policy_config"] = os.path.join(base, rc["router_policy_config"])
    return case


def servesim_args(case):
    args = ["predict", "--format", "json"]
    traces = case.get("traces") or ([case["trace"]] if case.get("trace") else None)
    if traces:
        args += traces
        if case.get("trace_block_size", 512) is not None:
            args += ["--trace-block-size", str(case.get("trace_block_size", 512))]
        if case.get("trace_format", "mooncake") != "mooncake":
            args += ["--trace-format", case["trace_format"]]
        for key in ["agentic_lanes", "execution_model", "weka_nested_timestamp_basis",
                    "trace_shared_prefix_ratio", "trace_num_prefix_groups"]:
            if case.get(key) is not None:
                args += ["--" + key.replace("_", "-"), str(case[key])]
    else:
        s = case["synthetic"]
        args += ["--input-tokens", str(s["input_tokens"]), "--output-tokens", str(s["output_tokens"]),
                 "--request-count", str(s["request_count"])]
        if s.get("request_rate") is not None:
            args += ["--request-rate", str(s["request_rate"])]
        if s.get("arrival_interval_ms") is not None:
            args += ["--arrival-interval-ms", str(s["arrival_interval_ms"])]
        for key in ["arrival_seed", "turns_per_session", "shared_prefix_ratio", "num_prefix_groups",
                    "inter_turn_delay_ms"]:
            if key in s:
                args += ["--" + key.replace("_", "-"), str(s[key])]
    launch = case.get("launch") or {}
    if case.get("engine") is not None:
        eng = {**launch, "engine": case["engine"]}
        if case.get("dp_size", 1) != 1:
            eng["dp_size"] = case["dp_size"]
        args += ["--extra-engine-args", json.dumps(eng)]
    if case.get("prefill_engine") is not None or case.get("decode_engine") is not None:
        def side(role):
            eng = {**launch, "engine": case.get(f"{role}_engine", {})}
            if case.get(f"{role}_dp_size", 1) != 1:
                eng["dp_size"] = case[f"{role}_dp_size"]
            return json.dumps(eng)
        args += ["--prefill-engine-args", side("prefill"), "--decode-engine-args", side("decode"),
                 "--num-prefill-workers", str(case.get("num_prefill_workers", 1)),
                 "--num-decode-workers", str(case.get("num_decode_workers", 1))]
    else:
        args += ["--num-workers", str(case.get("num_workers", 1))]
    if case.get("router_mode"):
        args += ["--router-mode", case["router_mode"]]
    if case.get("router_config") is not None:
        args += ["--router-config", json.dumps(case["router_config"])]
    if case.get("model_name") is not None:
        args += ["--model-name", case["model_name"]]
    if case.get("kv_event_lag_ms") is not None:
        args += ["--kv-event-lag-ms", str(case["kv_event_lag_ms"])]
    if case.get("replay_concurrency") is not None:
        args += ["--replay-concurrency", str(case["replay_concurrency"])]
    if case.get("arrival_speedup_ratio") not in (None, 1.0):
        args += ["--arrival-speedup-ratio", str(case["arrival_speedup_ratio"])]
    for key in ["sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms"]:
        if case.get(key) is not None:
            args += ["--" + key.replace("_", "-"), str(case[key])]
    return args


def run_servesim(case, binary, router_seed=None):
    start = time.perf_counter()
    seed = [] if router_seed is None else ["--router-seed", str(router_seed)]
    proc = subprocess.run([binary] + servesim_args(case) + seed, capture_output=True, text=True)
    if proc.returncode != 0:
        # servesim's own message (e.g. "no AIS performance data found"), not a traceback.
        sys.stderr.write(proc.stderr)
        sys.exit(f"servesim exited with {proc.returncode}")
    summary = json.loads(proc.stdout)
    summary["call_wall_ms"] = (time.perf_counter() - start) * 1000.0
    return summary


def run_reference(case):
    # AIS timing in engine arguments needs aisimulate beside Dynamo (the --with-dynamo venv).
    setup = ["setup_aisimulate.sh", "--with-dynamo"] if case.get("reference") == "dynamo+aisimulate" else ["setup.sh"]
    py = subprocess.run([os.path.join(SHARED, "parity", setup[0])] + setup[1:], check=True, capture_output=True,
                        text=True).stdout.strip()
    # A file of this run's own: parallel recordings must not read each other's case.
    fd, path = tempfile.mkstemp(prefix="servesim-parity-case-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(case, f)
        out = subprocess.run([py, os.path.join(ROOT, "scripts", "reference_replay.py"), path],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return json.loads(out)


def flatten_sections(summary):
    """The summary with its nested sections (Dynamo's `g3_offload`) as dotted numeric keys."""
    out = dict(summary)
    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = value
    for key in SECTIONS:
        if isinstance(summary.get(key), dict):
            walk(key, summary[key])
    return out


def compare(ours, ref, tolerances=None):
    """Returns (rows, ok). A section the reference reports (`g3_offload`) is compared too: its
    counts exactly, its sums of milliseconds within the usual tolerance. A random case (its own
    `tolerances`) compares only the metrics it lists: a section of one run says nothing there."""
    rows, ok = [], True
    random = tolerances is not None
    tolerances = dict(tolerances or TOLERANCES)
    ours, ref = flatten_sections(ours), flatten_sections(ref)
    exact = list(EXACT)
    for key in sorted(k for k in ref if "." in k and k.split(".")[0] in SECTIONS and not random):
        if isinstance(ref[key], float):
            tolerances.setdefault(key, 0.02)
        else:
            exact.append(key)
    for key in exact + list(tolerances):
        a, b = ours.get(key), ref.get(key)
        if key in exact:
            good = a == b
            dev = 0.0 if good else float("inf")
        else:
            dev = abs(a - b) / abs(b) if b else abs(a - b)
            good = dev <= tolerances[key]
        ok &= good
        rows.append((key, a, b, dev, good))
    return rows, ok


def median_summary(runs):
    """Per-key median of numeric summary values (the only value when there is one run)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            median = statistics.median(r[key] for r in runs)
            # An even number of runs averages the middle two; counts stay integers when they can.
            if all(isinstance(r[key], int) for r in runs) and float(median).is_integer():
                median = int(median)
            out[key] = median
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case")
    p.add_argument("--reference", action="store_true", help="compare against a fresh reference run")
    p.add_argument("--record", action="store_true", help="run the reference and write the golden file")
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    a = p.parse_args()
    case = resolve(a.case)
    golden_path = a.case[:-len(".json")] + ".golden.json"
    check = case.get("check", {})
    if a.record:
        runs = [run_reference(case) for _ in range(check.get("runs", 1))]
        ref = median_summary(runs)
        if len(runs) > 1:
            ref["_reference_runs"] = [{k: r[k] for k in EXACT + list(check["tolerances"])} for r in runs]
        json.dump(ref, open(golden_path, "w"), indent=1, sort_keys=True)
        print(f"wrote {golden_path}")
        return 0
    ref = run_reference(case) if a.reference else json.load(open(golden_path))
    seeds = check.get("seeds", 1)
    ours = run_servesim(case, a.binary) if seeds == 1 else \
        median_summary([run_servesim(case, a.binary, 42 + k) for k in range(seeds)])
    rows, ok = compare(ours, ref, check.get("tolerances"))
    print(f"{'metric':32} {'servesim':>16} {'reference':>16} {'deviation':>10}")
    for key, x, y, dev, good in rows:
        x = float("nan") if x is None else x
        print(f"{key:32} {x:>16.6g} {y:>16.6g} {dev*100:>9.3f}% {'' if good else '  <-- beyond tolerance'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
