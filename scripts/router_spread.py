#!/usr/bin/env python3
"""Compare the run-to-run spread of a KV-router case: servesim over router seeds against the
reference over repeated runs.

The reference's KV router breaks ties at random and cannot be seeded, so a router case has a
distribution on each side, not a number. This prints, per summary metric (nested sections such
as `g3_offload` flattened to dotted keys), the median of each side, their relative gap and a
two-sided Mann-Whitney U p-value (normal approximation with a tie correction). Metrics equal in
every run are left out; wall-clock metrics too.

  scripts/router_spread.py --case tests/parity/g3_kv_router_3w.json --runs 20
  scripts/router_spread.py --seed 20261243 --index 6 --runs 20 --show p95_ttft_ms
  scripts/router_spread.py --seed 20261242 --index 22 --runs 50 --show max_itl_ms

A case comes from a file (paths relative to it, as scripts/parity.py reads them) or from
scripts/difffuzz.py's generator. Runs go through difffuzz's runner: reference runs are cached in
its --cache-dir (run k of a case is the same cached sample every time), servesim's are router
seeds 42, 43, ... `--show` prints the sorted per-run values of the metrics it names.
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import difffuzz  # noqa: E402
import parity  # noqa: E402


def flatten(summary, prefix=""):
    out = {}
    for k, v in summary.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif difffuzz.is_number(v):
            out[prefix + k] = v
    return out


def mann_whitney_p(a, b):
    """Two-sided p-value of the Mann-Whitney U test, normal approximation with ties corrected."""
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks, i, ties = [0.0] * len(pooled), 0, 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    n1, n2 = len(a), len(b)
    u = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0) - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", help="a case file (tests/parity format) with router_mode kv_router")
    which.add_argument("--seed", type=int, help="a difffuzz seed (with --index)")
    p.add_argument("--index", type=int, help="the case's index under --seed")
    p.add_argument("--runs", type=int, default=20, help="runs on each side (default 20)")
    p.add_argument("--binary", default=difffuzz.DEFAULT_BINARY)
    p.add_argument("--cache-dir", default=difffuzz.DEFAULT_CACHE)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--show", default="", help="comma-separated metrics whose per-run values to print")
    a = p.parse_args()
    traces = difffuzz.TraceStore(a.cache_dir)
    if a.case:
        case = parity.resolve(a.case)
    elif a.index is None:
        p.error("--seed needs --index")
    else:
        case = difffuzz.generate_case(a.seed, a.index, traces)
    if case.get("router_mode") != "kv_router":
        p.error("not a kv_router case: both sides are deterministic, compare them with scripts/parity.py")
    args = argparse.Namespace(binary=a.binary, timeout=a.timeout, kv_runs=a.runs, kv_confirm=0,
                              tolerance=0.005, abs_floor=1e-6, cache_dir=a.cache_dir)
    runner = difffuzz.Runner(args, traces)
    refs, ours = runner.reference_runs(case), runner.servesim_runs(case)
    for side, runs in (("reference", refs), ("servesim", ours)):
        if runs[0]["status"] != "ok":
            sys.exit(f"{side}: {runs[0].get('error')}")
    refs = [flatten(r["summary"]) for r in refs]
    ours = [flatten(o["summary"]) for o in ours]
    keys = sorted(k for k in ours[0] if k in refs[0] and k not in difffuzz.WALL_KEYS
                  and all(k in r for r in refs + ours))
    print(f"{len(ours)} servesim seeds, {len(refs)} reference runs")
    print(f"{'metric':44} {'servesim median':>16} {'ref median':>16} {'gap %':>8} {'p':>8}")
    for k in keys:
        xs, ys = [o[k] for o in ours], [r[k] for r in refs]
        if min(xs + ys) == max(xs + ys):
            continue
        mx, my = statistics.median(xs), statistics.median(ys)
        gap = 100 * (mx - my) / abs(my) if my else float("nan")
        print(f"{k:44} {mx:16.6g} {my:16.6g} {gap:8.2f} {mann_whitney_p(xs, ys):8.3g}")
    for k in filter(None, a.show.split(",")):
        print(f"{k} servesim: {sorted(o.get(k) for o in ours)}")
        print(f"{k} reference: {sorted(r.get(k) for r in refs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
