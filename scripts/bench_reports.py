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
one-loop run. On a machine shared with other work wall time also measures the neighbours, so
three more estimates of the same overhead follow: `paired`, the median over rounds of each
round's reports / one-loop ratio (the two runs are adjacent, so slow drifts in load cancel);
`fastest`, the fastest reports run against the fastest one-loop run (interference only adds
time); `CPU`, the median user + system time against the one-loop run's. Build first:
cargo build --release -p servesim.

  scripts/bench_reports.py --instructions       # instructions under callgrind, no timing

With --instructions each case runs once one-loop and once with the reports under valgrind's
callgrind, which counts the instructions executed: the same for every run of the same binary,
whatever else the machine is doing (about 50 times slower than a run).
"""
import argparse, atexit, glob, os, re, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import parity  # noqa: E402

ROOT = parity.ROOT


def timed(argv):
    """Wall seconds and CPU seconds (user + system) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    stderr = proc.stderr.read()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}: {stderr.strip()}")
    return took, usage.ru_utime + usage.ru_stime


def instructions(argv):
    """Instructions one run executes, counted by callgrind."""
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
                          capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        sys.exit(f"valgrind {' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return int(found.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    p.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead of timing")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="servesim-bench-reports-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    cases = a.cases or sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.json")))
    if a.instructions:
        print(f"{'case':<36} {'1-loop instructions':>20} {'reports instructions':>21} {'vs 1-loop':>10}")
    else:
        print(f"{'case':<36} {'plain s':>8} {'1-loop s':>9} {'reports s':>10} {'vs plain':>9} {'vs 1-loop':>10}"
              f" {'paired':>8} {'fastest':>8} {'CPU':>7}")
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
        if a.instructions:
            one, rep = instructions(ways["one_loop"]), instructions(ways["reports"])
            print(f"{os.path.basename(c)[:-5]:<36} {one:>20,} {rep:>21,} {100 * (rep / one - 1):>9.2f}%", flush=True)
            continue
        times = {k: [] for k in ways}
        cpu = {k: [] for k in ways}
        for _ in range(a.rounds):
            for k, argv in ways.items():
                wall, used = timed(argv)
                times[k].append(wall)
                cpu[k].append(used)
        m = {k: statistics.median(v) for k, v in times.items()}
        u = {k: statistics.median(v) for k, v in cpu.items()}
        paired = statistics.median(r / o for r, o in zip(times["reports"], times["one_loop"]))
        fastest = min(times["reports"]) / min(times["one_loop"])
        print(f"{os.path.basename(c)[:-5]:<36} {m['plain']:>8.2f} {m['one_loop']:>9.2f} {m['reports']:>10.2f} "
              f"{100 * (m['reports'] / m['plain'] - 1):>8.1f}% {100 * (m['reports'] / m['one_loop'] - 1):>9.1f}% "
              f"{100 * (paired - 1):>7.1f}% {100 * (fastest - 1):>7.1f}% {100 * (u['reports'] / u['one_loop'] - 1):>6.1f}%",
              flush=True)


if __name__ == "__main__":
    main()
