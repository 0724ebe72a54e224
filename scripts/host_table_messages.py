#!/usr/bin/env python3
"""The reference's host cost table lookups, for the goldens of crates/deploy/src/host_table.rs.

  $AISIM_REF_VENV/bin/python scripts/host_table_messages.py tests/deploy/host_profile/table.json

Resolves a few workloads against TABLE with aisimulate 0.13's own lookup (`resolve_frontend`)
and prints, one line each, `OK <stages> <digest>` or `ERR <exception> <message>`: rows that
match, a tensor size and image shapes that do not, a missing file, and a path with spaces and
quotes (nonexistent on purpose: its message shows how the collect command quotes it).
"""
import sys, json
from aisimulate.config.engine import HostProfileConfig
from aisimulate.vl.table import resolve_frontend
def run(path, frontend, images, tensor=1, model="Qwen/Qwen3-VL-8B-Instruct"):
    try:
        f, d = resolve_frontend(HostProfileConfig(path=path, frontend=frontend), model=model, images=images, tensor=tensor)
        print("OK", json.dumps(f.model_dump(mode="json")), d)
    except Exception as e:
        print("ERR", type(e).__name__, repr(str(e)))
t = sys.argv[1]
run(t, "rust", {"height": 448, "width": 448})
run(t, "rust", {"height": 448, "width": 448}, tensor=2)
run(t, "python", {"height": 448, "width": 448, "count": 2, "encoding": "jpeg"})
run(t, "python", {"height": 448, "width": 448, "min_pixels": 100, "max_pixels": 20000})
run(t + ".missing", "rust", {"height": 448, "width": 448})
run("/tmp/s19/fe/my table.json", "rust", {"height": 448, "width": 448}, model="org/it's")
