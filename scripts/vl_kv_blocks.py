#!/usr/bin/env python3
"""KV blocks the reference sizes for a native-VL worker (the goldens of crates/deploy/src/vl.rs).

  $AISIM_REF_VENV/bin/python scripts/vl_kv_blocks.py tests/deploy/predict_native_vl.yaml \
      'tests/deploy/predict_native_vl.yaml@engine.workers.aggregated.vision={cache_mib: 0}'

Each argument is a unified-YAML config, optionally followed by `@dotted.key=YAML value`
overrides. For each, the config is validated and compiled as aisimulate 0.13's `predict` does
(`prediction_to_replay_spec`), and the aggregated (else prefill) worker's engine arguments go
through the reference's memory model (`materialize_aic_num_gpu_blocks`); the line printed is the
argument and the number of GPU KV blocks it materialises.
"""
import sys

import yaml
from aisimulate.capacity import materialize_aic_num_gpu_blocks
from aisimulate.compiler import prediction_to_replay_spec
from aisimulate.config.cli import CorePredictionConfig


def load(arg):
    path, *overrides = arg.split("@")
    with open(path) as f:
        config = yaml.safe_load(f)
    for override in overrides:
        key, value = override.split("=", 1)
        *parents, leaf = key.split(".")
        node = config
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    return config


def main(args):
    for arg in args:
        spec = prediction_to_replay_spec(CorePredictionConfig.model_validate(load(arg)))
        deployment = spec.backend_deployment if hasattr(spec, "backend_deployment") else spec[0].backend_deployment
        engine_args = deployment.agg_engine_args or deployment.prefill_engine_args
        print(arg, materialize_aic_num_gpu_blocks(dict(engine_args)).get("num_gpu_blocks"))


if __name__ == "__main__":
    main(sys.argv[1:])
