#!/usr/bin/env python3
"""Speed and memory of servesim next to the reference (Dynamo 1.6.1's replay), side by side.

  scripts/bench.py                          # the four cases in benchmarks/, 3 rounds
  scripts/bench.py --rounds 5 benchmarks/a_conversation_8w_round_robin.json
  scripts/bench.py --servesim-only          # skip the reference (quick check of our numbers)

A case is a parity case file (see scripts/parity.py). `"repeat": N` replays the trace N times
back to back: copy k is shifted past the end of copy k-1 and its hash ids are offset so that no
copy shares a cached block with another. The repeated trace is written to a temporary directory.

Each round runs servesim and then the reference on every case (alternating, so machine noise hits
both alike) and records whole-call wall time and peak RSS. Wall time is the whole servesim process
(trace loading included) and, for the reference, the replay call as dynamo_replay.py measures it
(trace loading included, interpreter start-up excluded). Peak RSS is each process's maximum
resident set. The table shows medians over the rounds and checks that both sides completed the
same number of requests. Build first: cargo build --release.
"""
import argparse, atexit, glob, json, os, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402

ROOT = parity.ROOT


def repeated_trace(src, copies, out_dir):
    """Writes `copies` back-to-back copies of a Mooncake trace with disjoint hash ids."""
    rows = [json.loads(line) for line in open(src) if line.strip()]
    span = max(r.get("timestamp", 0) for r in rows) - min(r.get("timestamp", 0) for r in rows)
    gap = span / max(len(rows) - 1, 1)
    hash_span = max(h for r in rows for h in r["hash_ids"]) + 1
    path = os.path.join(out_dir, f"{os.path.basename(src)[:-6]}_x{copies}.jsonl")
    with open(path, "w") as f:
        for k in range(copies):
            for r in rows:
                r = dict(r)
                r["timestamp"] = r.get("timestamp", 0) + k * (span + gap)
                r["hash_ids"] = [h + k * hash_span for h in r["hash_ids"]]
                f.write(json.dumps(r) + "\n")
    return path


def run_measured(argv):
    """Runs a command; returns its stdout, wall seconds and peak RSS in MiB.

    The RSS comes from /usr/bin/time, whose child is forked from a small process: a child forked
    from this Python interpreter would count the interpreter's pages in its peak.
    """
    with tempfile.NamedTemporaryFile("r") as rss_file:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file.name] + argv,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(argv[:3])} ... failed with status {proc.returncode}")
        rss_kib = int(rss_file.read().split()[-1])
    return proc.stdout, wall, rss_kib / 1024.0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="*", default=sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.json"))))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    p.add_argument("--servesim-only", action="store_true", help="do not run the reference")
    a = p.parse_args()
    if not a.servesim_only:
        ref_py = subprocess.run([os.path.join(parity.SHARED, "parity", "setup.sh")], check=True,
                                capture_output=True, text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="servesim-bench-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    cases = {}
    for c in a.cases:
        case = parity.resolve(c)
        if case.get("repeat", 1) > 1:
            case["trace"] = repeated_trace(case["trace"], case.pop("repeat"), tmp)
        case.pop("repeat", None)
        cases[c] = case
    keys = ["ours_wall", "ours_rss", "ref_wall", "ref_rss", "ours_done", "ref_done"]
    results = {c: {k: [] for k in keys} for c in cases}
    for r in range(a.rounds):
        for c, case in cases.items():
            out, wall, rss = run_measured([a.binary] + parity.servesim_args(case))
            m = results[c]
            m["ours_wall"].append(wall * 1000)
            m["ours_rss"].append(rss)
            m["ours_done"].append(json.loads(out)["completed_requests"])
            line = f"round {r + 1}/{a.rounds} {os.path.basename(c)}: servesim {wall * 1000:.0f} ms {rss:.0f} MiB"
            if not a.servesim_only:
                case_file = os.path.join(tmp, "case.json")
                json.dump(case, open(case_file, "w"))
                out, _, rss = run_measured([ref_py, os.path.join(parity.SHARED, "parity", "dynamo_replay.py"),
                                            case_file])
                ref = json.loads(out)
                m["ref_wall"].append(ref["call_wall_ms"])
                m["ref_rss"].append(rss)
                m["ref_done"].append(ref["completed_requests"])
                line += f", reference {ref['call_wall_ms']:.0f} ms {rss:.0f} MiB"
            print(line, file=sys.stderr)
    med = statistics.median
    print(f"{'case':38} {'servesim ms':>11} {'reference ms':>12} {'speedup':>8} "
          f"{'servesim MiB':>12} {'reference MiB':>13} {'memory':>7}  completed")
    for c, m in results.items():
        name = os.path.basename(c)[:-5]
        ow, orss = med(m["ours_wall"]), med(m["ours_rss"])
        if a.servesim_only:
            print(f"{name:38} {ow:>11.0f} {'-':>12} {'-':>8} {orss:>12.1f} {'-':>13} {'-':>7}  {m['ours_done'][0]}")
            continue
        rw, rrss = med(m["ref_wall"]), med(m["ref_rss"])
        same = "same" if m["ours_done"][0] == m["ref_done"][0] else f"DIFFERENT {m['ours_done'][0]} vs {m['ref_done'][0]}"
        print(f"{name:38} {ow:>11.0f} {rw:>12.0f} {rw / ow:>7.1f}x {orss:>12.1f} {rrss:>13.1f} "
              f"{orss / rrss:>7.1%}  {same}")


if __name__ == "__main__":
    main()
