#!/usr/bin/env python3
"""Speed of `servesim recommend` on a 1,000-candidate grid, and of one candidate next to the
reference (aisimulate 0.13's `predict`, the same YAML).

  scripts/bench_recommend.py                    # the grid, then one candidate on both sides
  scripts/bench_recommend.py --servesim-only    # skip the reference
  scripts/bench_recommend.py --threads 2 --config benchmarks/recommend_grid_1000.yaml

The grid (benchmarks/recommend_grid_1000.yaml) is the traffic of the reference's
predict_agg_vllm_default example with AIS timing; every candidate is replayed (--no-cache, all
within the GPU budget). Printed: wall time of the whole `recommend` process, per trial (wall
divided by trials) and per trial per thread (wall x threads / trials: the cost of one trial on
one core). Then the best candidate's replayable YAML (recommendations/0001.yaml) is predicted
by servesim (`predict -c`) and by the reference (../shared/parity/aisimulate_predict.py, the
venv of $AISIM_REF_VENV or ../shared/parity/setup_aisimulate.sh), each timed as a whole process
(`call_wall_ms` is the reference driver's own measure of the aisimulate call), and their output
throughput compared. The AIS data package must be found (set AISIM_REF_VENV). Build first:
cargo build --release -p servesim.
"""
import argparse, json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


def run(cmd, **kw):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout, wall


def reference_python():
    venv = os.environ.get("AISIM_REF_VENV")
    if venv and os.path.exists(os.path.join(venv, "bin", "python")):
        return os.path.join(venv, "bin", "python")
    out = subprocess.run([os.path.join(SHARED, "parity", "setup_aisimulate.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"no reference venv: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "benchmarks", "recommend_grid_1000.yaml"))
    ap.add_argument("--threads", type=int, default=0, help="recommend --threads (0: every core)")
    ap.add_argument("--servesim-only", action="store_true")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    a = ap.parse_args()
    threads = a.threads or os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "rec")
        stdout, wall = run([a.binary, "recommend", "-c", a.config, "--output-dir", out_dir, "--no-cache",
                            "--threads", str(threads), "--format", "json"])
        doc = json.loads(stdout)
        counts = doc["counts"]
        n = counts["evaluated"]
        replayed = n - counts["infeasible"] - counts["unsupported"]
        print(f"servesim recommend: {n} candidates ({counts['feasible']} feasible, {replayed} replayed) "
              f"on {threads} threads")
        print(f"  wall {wall:.2f} s; per trial {1000 * wall / n:.1f} ms; "
              f"per trial per thread {1000 * wall * threads / n:.1f} ms")
        best = doc["candidates"][int(doc["views"]["top_n"][0].split("-")[1]) - 1]
        print(f"  best {best['candidate_id']}: {best['config']} score {best['score']:.2f}")
        cand = os.path.join(out_dir, "recommendations", "0001.yaml")
        stdout, ours = run([a.binary, "predict", "-c", cand, "--output-dir", os.path.join(tmp, "pred"), "--format", "json"])
        our_tps = json.loads(stdout).get("output_throughput_tok_s")
        print(f"one candidate (recommendations/0001.yaml): servesim predict -c {ours * 1000:.0f} ms "
              f"(output {our_tps:.1f} tok/s)")
        if a.servesim_only:
            return
        py = reference_python()
        stdout, theirs = run([py, os.path.join(SHARED, "parity", "aisimulate_predict.py"), cand, "--summary-only"])
        ref = json.loads(stdout)
        ref_tps = ref.get("output_throughput_tok_s")
        call = ref.get("call_wall_ms")
        print(f"  reference aisimulate predict {theirs * 1000:.0f} ms as a process"
              + (f" ({call:.0f} ms aisimulate call)" if call else "")
              + f" (output {ref_tps:.1f} tok/s; {100 * (our_tps / ref_tps - 1):+.3f} %)")
        print(f"  the reference's one predict takes {theirs / (wall / n):.0f}x servesim's per-trial wall time")


if __name__ == "__main__":
    main()
