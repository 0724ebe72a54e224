#!/usr/bin/env python3
"""Per-op comparison of servesim's AIS timing model with the reference, for one config and shape.

Run with the aisimulate reference venv's python (it has aisimulate_core):

    $AISIM_REF_VENV/bin/python scripts/ais_ops.py CONFIG_JSON BATCH ISL PREFIX \
        [--servesim target/release/servesim] [--database-mode SOL]

CONFIG_JSON is a ForwardPassPerfModelConfig (model, system, backend, tp, moe_tp_size, ...). The
reference's op evidence is `static_phase_diagnostics` of the static context step (BATCH requests
reaching ISL tokens, PREFIX cached) and of one generation step at context_length ISL; servesim's
is `servesim perf --per-op` at the same prefill and a decode at context ISL + 1 (on the config's
`systems_paths` when it names any, e.g. a DeepSeek-V4.1 profile root, else the venv's systems). Prints every op
of both (reference, servesim, relative difference), marking those that differ by more than 1e-9.
"""
import argparse
import json
import os
import subprocess
import sys

import aisimulate_core
from aisimulate_core.sdk import RustForwardPassPerfModel

SYSTEMS = os.path.join(os.path.dirname(aisimulate_core.__file__), "systems")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("batch", type=int)
    ap.add_argument("isl", type=int)
    ap.add_argument("prefix", type=int)
    ap.add_argument("--servesim", default="target/release/servesim")
    ap.add_argument("--database-mode", default=None)
    a = ap.parse_args()
    cfg = json.loads(a.config)
    cfg.setdefault("worker_type", "aggregated")
    if a.database_mode:
        cfg["database_mode"] = a.database_mode
    model = RustForwardPassPerfModel.best_available(dict(cfg))
    ref = {}
    for prefill in (True, False):
        kw = {"prefix": a.prefix} if prefill else {}
        for op in model.static_phase_diagnostics(batch_size=a.batch, context_length=a.isl, prefill=prefill, **kw):
            ref[op["name"]] = op["latency_ms"]
    cmd = [a.servesim, "perf", "--config", json.dumps({**cfg, "systems_paths": cfg.get("systems_paths") or [SYSTEMS]}), "--batch", str(a.batch),
           "--isl", str(a.isl), "--prefix", str(a.prefix), "--context", str(a.isl + 1), "--per-op", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"servesim: {p.stderr.strip()}")
    out = json.loads(p.stdout)
    ours = {}
    for op in out["prefill_ops"] + out["decode_ops"]:
        ours[op["op"]] = ours.get(op["op"], 0.0) + op["ms"]
    bad = 0
    for name in dict.fromkeys(list(ref) + list(ours)):
        r, s = ref.get(name), ours.get(name)
        rel = abs(r - s) / abs(r) if (r is not None and s is not None and r != 0) else None
        same = r is not None and s is not None and (r == s or (rel is not None and rel <= 1e-9))
        bad += not same
        print(f"{name:40} {r!s:>24} {s!s:>24} {'' if rel is None else f'{rel:.2e}'}{'' if same else '  <<<'}")
    print(f"{bad} ops differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
