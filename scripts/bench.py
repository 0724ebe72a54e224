#!/usr/bin/env python3
"""Speed and memory of servesim next to the reference (Dynamo 1.6.1's replay), side by side.

  scripts/bench.py                        # case (a): conversation trace, 8 workers, 3 rounds
  scripts/bench.py --rounds 5 tests/parity/a_conversation_8w.json tests/parity/d_synthetic_1024_128_20rps.json

Each round runs servesim and then the reference on every case (alternating, so machine noise hits
both alike) and records whole-call wall time and peak RSS. Wall time is the whole servesim process
(trace loading included) and, for the reference, the replay call as dynamo_replay.py measures it
(trace loading included, interpreter start-up excluded). Peak RSS is each process's maximum
resident set. The table shows medians over the rounds. Build first: cargo build --release.
"""
import argparse, json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402

ROOT = parity.ROOT


def run_measured(argv):
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{' '.join(argv[:3])} ... failed with status {status}")
    return out, wall, usage.ru_maxrss / 1024.0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", default=[os.path.join(ROOT, "tests/parity/a_conversation_8w.json")])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    a = p.parse_args()
    ref_py = subprocess.run([os.path.join(parity.SHARED, "parity", "setup.sh")], check=True,
                            capture_output=True, text=True).stdout.strip()
    results = {c: {"ours_wall": [], "ours_rss": [], "ref_wall": [], "ref_rss": []} for c in a.cases}
    for r in range(a.rounds):
        for c in a.cases:
            case = parity.resolve(c)
            _, wall, rss = run_measured([a.binary] + parity.servesim_args(case))
            results[c]["ours_wall"].append(wall * 1000)
            results[c]["ours_rss"].append(rss)
            tmp = f"/tmp/servesim-bench-case-{os.getpid()}.json"
            json.dump(case, open(tmp, "w"))
            out, _, rss = run_measured([ref_py, os.path.join(parity.SHARED, "parity", "dynamo_replay.py"), tmp])
            results[c]["ref_wall"].append(json.loads(out)["call_wall_ms"])
            results[c]["ref_rss"].append(rss)
            print(f"round {r + 1}/{a.rounds} {os.path.basename(c)}: servesim {wall * 1000:.0f} ms, "
                  f"reference {results[c]['ref_wall'][-1]:.0f} ms", file=sys.stderr)
    print(f"{'case':40} {'servesim ms':>12} {'reference ms':>13} {'speedup':>8} "
          f"{'servesim MiB':>13} {'reference MiB':>14} {'memory':>8}")
    for c, m in results.items():
        ow, rw = statistics.median(m["ours_wall"]), statistics.median(m["ref_wall"])
        orss, rrss = statistics.median(m["ours_rss"]), statistics.median(m["ref_rss"])
        print(f"{os.path.basename(c)[:-5]:40} {ow:>12.0f} {rw:>13.0f} {rw / ow:>7.1f}x "
              f"{orss:>13.1f} {rrss:>14.1f} {orss / rrss:>7.1%}")


if __name__ == "__main__":
    main()
