#!/usr/bin/env python3
"""A systems root on which Llama 4's vision tower can be timed (goldens predict_native_vl_llama4*).

No installed system measures encoder attention at Llama 4's ViT head size (1408 / 16 = 88), so
the reference refuses Llama 4 images everywhere ("encoder attention data missing ... head_size:
88"). To check servesim's Llama 4 tower against the reference anyway, both read one made-up
table: h200_sxm's SGLang 0.5.14 head-80 rows relabelled as head 88, latency x 1.1.

  $AISIM_REF_VENV/bin/python scripts/llama4_vision_systems.py --fixture
      writes tests/deploy/fixtures/encoder_attention_head88.parquet (only those rows)
  $AISIM_REF_VENV/bin/python scripts/llama4_vision_systems.py ROOT
      assembles ROOT: h200_sxm.yaml and the installed h200_sxm data (hard links; the reference
      refuses data resolving outside its root), the encoder attention table being the fixture
      alone, and ROOT/../model_configs (servesim's model lookup) linked to the packaged ones.
The Rust test (crates/cli/tests/deploy.rs `llama4_native_vl_matches_the_reference`) assembles
the same root.
"""
import os
import shutil
import sys
from pathlib import Path

import aisimulate_core
import pyarrow.parquet as pq

PKG = Path(aisimulate_core.__file__).parent
SYSTEMS = PKG / "systems"
FIXTURE = Path(__file__).resolve().parent.parent / "tests/deploy/fixtures/encoder_attention_head88.parquet"
TABLE = "encoder_attention/sglang/0.5.14"


def fixture():
    t = pq.read_table(SYSTEMS / "data/h200_sxm" / TABLE / "encoder_attention_perf.parquet")
    d = t.to_pandas()
    d = d[d.head_dim == 80].copy()
    d["head_dim"] = 88
    d["latency"] = d["latency"] * 1.1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t.from_pandas(d, schema=t.schema, preserve_index=False), FIXTURE)
    print(FIXTURE, len(d))


def assemble(root):
    root = Path(root)
    data = root / "data/h200_sxm"
    data.mkdir(parents=True)
    for name in ["h200_sxm.yaml", "attention_lane_defaults.yaml"]:
        shutil.copy(SYSTEMS / name, root / name)
    for op in (SYSTEMS / "data/h200_sxm").iterdir():
        if op.name != "encoder_attention":
            shutil.copytree(op, data / op.name, copy_function=os.link)
    table = data / TABLE
    table.mkdir(parents=True)
    shutil.copy(FIXTURE, table / "encoder_attention_perf.parquet")
    configs = root.parent / "model_configs"
    if not configs.exists():
        configs.symlink_to(PKG / "model_configs")
    print(root)


if __name__ == "__main__":
    if sys.argv[1:] == ["--fixture"]:
        fixture()
    else:
        assemble(sys.argv[1])
