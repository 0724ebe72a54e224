#!/usr/bin/env python3
"""Speed of one `servesim predict -c` call next to the reference's (aisimulate 0.13 `predict`
on the same YAML), per model family.

  scripts/bench_predict.py                      # the default set, 3 runs each side
  scripts/bench_predict.py --runs 5 tests/deploy/predict_agg_deepseek_v3.yaml
  scripts/bench_predict.py --all                # every tests/deploy/predict_*.yaml

Each run is one whole process, as a user pays for it: start-up, finding and reading the AIS
tables, the replay and the report. Printed per config, medians over the runs: wall seconds and
CPU seconds (user + system of the process and the processes it waited for, e.g. the Python
interpreter servesim asks where the data package lives). On a loaded machine wall time swings
with the neighbours; CPU time is the steadier measure of the work, and the ratio is printed for
both. The AIS data package must be found the way the tests find it (set AISIM_REF_VENV, or run
scripts/setup_test_env.sh). Build first: cargo build --release -p servesim.
"""
import argparse, glob, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# One config per family the AIS model times: dense, MLA + MoE, NVFP4 MLA, plain MoE, hybrid
# GDN, Mamba2, the vision-language text path, speculation, the state cache and AFD.
DEFAULT = [
    "predict_agg_vllm_default",
    "predict_agg_deepseek_v3",
    "predict_agg_nvfp4_deepseek_v31",
    "predict_agg_qwen35_moe",
    "predict_agg_nemotron_h_nano",
    "predict_agg_qwen3vl_moe",
    "predict_spec_draft_model_vllm",
    "predict_state_cache_eviction",
    "predict_afd_qwen3_moe_optimistic",
]


def timed(cmd):
    """Wall and CPU seconds of one process (CPU includes the children it waited for)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{' '.join(cmd)} failed ({code}):\n{err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def reference_python():
    venv = os.environ.get("AISIM_REF_VENV")
    if venv and os.path.exists(os.path.join(venv, "bin", "python")):
        return os.path.join(venv, "bin", "python")
    sys.exit("set AISIM_REF_VENV to the reference's venv (../shared/parity/setup_aisimulate.sh makes one)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", help="predict YAML files (default: one per family)")
    ap.add_argument("--all", action="store_true", help="every tests/deploy/predict_*.yaml")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    ap.add_argument("--servesim-only", action="store_true")
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("--runs must be at least 1")
    if a.configs:
        configs = a.configs
    elif a.all:
        configs = sorted(glob.glob(os.path.join(ROOT, "tests", "deploy", "predict_*.yaml")))
    else:
        configs = [os.path.join(ROOT, "tests", "deploy", f"{n}.yaml") for n in DEFAULT]
    ref = None if a.servesim_only else reference_python()
    driver = os.path.join(SHARED, "parity", "aisimulate_predict.py")
    print(f"{'config':<38} {'servesim wall/cpu s':>20} {'reference wall/cpu s':>21} {'× wall':>7} {'× cpu':>6}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in configs:
            name = os.path.basename(cfg).removesuffix(".yaml")
            ours = [timed([a.binary, "predict", "-c", cfg, "--output-dir", os.path.join(tmp, name), "--overwrite",
                           "--format", "json"]) for _ in range(a.runs)]
            ow, oc = statistics.median(w for w, _ in ours), statistics.median(c for _, c in ours)
            line = f"{name:<38} {ow:>9.2f} / {oc:>8.2f}"
            if ref:
                theirs = [timed([ref, driver, cfg]) for _ in range(a.runs)]
                rw, rc = statistics.median(w for w, _ in theirs), statistics.median(c for _, c in theirs)
                ratios.append((rw / ow, rc / oc))
                line += f" {rw:>10.2f} / {rc:>8.2f} {rw / ow:>7.1f} {rc / oc:>6.1f}"
            print(line, flush=True)
    if ratios:
        print(f"{'smallest ratio':<38} {'':>20} {'':>21} {min(r for r, _ in ratios):>7.1f} "
              f"{min(c for _, c in ratios):>6.1f}")


if __name__ == "__main__":
    main()
