#!/usr/bin/env python3
"""CPU time of two or more servesim binaries on the same cases, for before/after comparisons.

  scripts/bench_cpu.py --binaries OLD/servesim,target/release/servesim            # benchmarks/*.json
  scripts/bench_cpu.py --binaries A,B --rounds 5 benchmarks/e_conversation_2w_sglang_page1.json

Wall time is what users see (scripts/bench.py measures it beside the reference), but on a
shared machine it swings with everyone else's load. User plus system CPU time of a
single-threaded run (--threads 1) barely does, so this is the number to compare builds by.
Binaries run alternately, round after round; the table shows each one's median and the ratio
of every binary to the first.
"""
import argparse, glob, json, os, resource, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import parity  # noqa: E402


def cpu_seconds(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", default=sorted(glob.glob(os.path.join(parity.ROOT, "benchmarks", "*.json"))))
    p.add_argument("--binaries", required=True, help="comma-separated servesim binaries; the first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    binaries = a.binaries.split(",")
    header = f"{'case':<38}" + "".join(f"{'binary ' + str(i + 1):>16}" for i in range(len(binaries)))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in a.cases:
            case = parity.resolve(path)
            copies = json.load(open(path)).get("repeat")
            if copies:
                case["trace"] = bench.repeated_trace(case["trace"], copies, tmp)
            argv = parity.servesim_args(case) + ["--threads", "1"]
            times = {b: [] for b in binaries}
            for _ in range(a.rounds):
                for b in binaries:
                    times[b].append(cpu_seconds([b] + argv))
            medians = [statistics.median(times[b]) * 1000 for b in binaries]
            name = os.path.basename(path)[:-5]
            cells = [f"{medians[0]:>13.0f} ms"] + [f"{m:>8.0f} ms {m / medians[0]:>5.2f}×" for m in medians[1:]]
            rows.append(f"{name:<38}" + "".join(f"{c:>16}" for c in cells))
            print(rows[-1], file=sys.stderr, flush=True)
    for i, b in enumerate(binaries):
        print(f"binary {i + 1}: {b}")
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
