#!/usr/bin/env python3
"""The real-hardware benchmark (../shared/real-hw/run.py) with servesim's timing options.

    python3 scripts/real_hw.py --servesim target/release/servesim [--mode reference|hardware]
                               [--set KEY=VALUE ...] [--timing-jitter-cv CV]
                               [run.py options: --only, --json, --work ...]

run.py runs every development experiment's YAML through `servesim predict -c` and prints the
error table against the measurements. This wrapper runs it unchanged, except that every
`predict` it starts gets the `--set` overrides of the chosen mode and of `--set` (and
`--timing-jitter-cv`, if given):

- `reference` (default): the YAML as written, AIS timing equal to aisimulate's.
- `hardware`: the hardware-faithful settings (`HARDWARE` below): mixed passes timed as one
  fused forward, vLLM's async scheduling (the servers ran vLLM 0.15.1, where it is on), a
  frontend cost per request (HTTP, parsing, tokenisation: the set's measured median, 9.5 ms,
  through the `engine.tokenization` stage with enough workers never to queue), and a per-pass
  host overhead the kernel tables lack (0.5 ms, the set's best single value).

docs/accuracy.md holds the tables this prints and what each setting is for.

`--real-hw DIR` points at the benchmark (default: ../shared/real-hw beside the repository).
"""
import argparse
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every experiment is an aggregated vLLM deployment.
HARDWARE = ["engine.workers.aggregated.timing.pass_model=fused",
            "engine.workers.aggregated.scheduler.async_scheduling=true",
            "engine.tokenization.base_ms=9.5",
            "engine.tokenization.workers=64",
            "engine.workers.aggregated.timing.calibration.pass_overhead_ms=0.5"]


def load_runner(real_hw):
    path = os.path.join(real_hw, "run.py")
    if not os.path.isfile(path):
        sys.exit(f"real_hw.py: {path} not found (give --real-hw DIR)")
    spec = importlib.util.spec_from_file_location("real_hw_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PredictWithOverrides:
    """Stands in for the `subprocess` module inside run.py: `predict` commands get the
    overrides, everything else runs as asked."""

    def __init__(self, overrides, jitter_cv=None):
        self.extra = [arg for kv in overrides for arg in ("--set", kv)]
        if jitter_cv is not None:
            self.extra += ["--timing-jitter-cv", str(jitter_cv)]

    def run(self, cmd, *args, **kwargs):
        if len(cmd) > 1 and cmd[1] == "predict":
            cmd = list(cmd) + self.extra
        return subprocess.run(cmd, *args, **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("--mode", choices=["reference", "hardware"], default="reference")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a YAML override for every predict (repeatable)")
    ap.add_argument("--timing-jitter-cv", type=float, metavar="CV",
                    help="predict's per-pass timing noise (coefficient of variation)")
    ap.add_argument("--real-hw", default=os.path.join(os.path.dirname(ROOT), "shared", "real-hw"))
    ap.add_argument("-h", "--help", action="store_true")
    a, rest = ap.parse_known_args()
    runner = load_runner(os.path.abspath(a.real_hw))
    if a.help:
        ap.print_help()
        print("\nrun.py's own options follow.\n")
        sys.argv = [sys.argv[0], "--help"]
        runner.main()
        return
    overrides = (HARDWARE if a.mode == "hardware" else []) + a.sets
    print(f"mode {a.mode}; overrides: {' '.join(overrides) or 'none'}", file=sys.stderr)
    runner.subprocess = PredictWithOverrides(overrides, a.timing_jitter_cv)
    sys.argv = [sys.argv[0]] + rest
    runner.main()


if __name__ == "__main__":
    main()
