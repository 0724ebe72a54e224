#!/usr/bin/env python3
"""What telemetry and the HTML report cost: replay time with and without them.

  scripts/bench_reports.py                      # every case in benchmarks/, 3 rounds
  scripts/bench_reports.py --rounds 5 benchmarks/d_synthetic_20k_2048_256_80rps.json

Per case, each round runs `servesim predict` three ways, alternating so machine noise hits all
alike: plain (the default, which may split round-robin workers across threads), plain with
--no-split-workers (one event loop, as a run with telemetry or an HTML report is), and with
`--telemetry FILE --report-html FILE` at the default interval (1000 simulated ms). Wall time is
the whole process (trace loading and writing included); the table shows medians over the rounds
and the overhead of the reports against both plain runs. The target is under 10 % against the
one-loop run. Build first: cargo build --release -p servesim.
"""
import argparse, glob, os, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import parity  # noqa: E402

ROOT = parity.ROOT


def timed(argv):
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return took


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="servesim-bench-reports-")
    cases = a.cases or sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.json")))
    print(f"{'case':<44} {'plain s':>8} {'1-loop s':>9} {'reports s':>10} {'vs plain':>9} {'vs 1-loop':>10}")
    for c in cases:
        case = parity.resolve(c)
        if case.get("repeat", 1) > 1:
            case["trace"] = bench.repeated_trace(case["trace"], case["repeat"], tmp)
        case.pop("repeat", None)
        base = [a.binary] + parity.servesim_args(case)
        ways = {
            "plain": base,
            "one_loop": base + ["--no-split-workers"],
            "reports": base + ["--telemetry", os.path.join(tmp, "t.jsonl"), "--report-html", os.path.join(tmp, "r.html")],
        }
        times = {k: [] for k in ways}
        for _ in range(a.rounds):
            for k, argv in ways.items():
                times[k].append(timed(argv))
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"{os.path.basename(c)[:-5]:<44} {m['plain']:>8.2f} {m['one_loop']:>9.2f} {m['reports']:>10.2f} "
              f"{100 * (m['reports'] / m['plain'] - 1):>8.1f}% {100 * (m['reports'] / m['one_loop'] - 1):>9.1f}%")


if __name__ == "__main__":
    main()
