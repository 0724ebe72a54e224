"""Engine arguments whose meaning Dynamo 1.6.1 decides at launch: AIS timing sizes the KV cache
from GPU memory and sets the parallelism it leaves open, and ``dynamo.router_queue_policy``
reaches the router. Reference numbers: ``_normalize_mocker_config`` of Dynamo 1.6.1 with
aisimulate installed (``../shared/parity/setup_aisimulate.sh --with-dynamo``), Qwen3-32B on
H200. The AIS cases need the AIS data and skip without it."""

import json

import pytest

from servesim import _core
from servesim.mocker.args import parse_args
from servesim.mocker.config import build_mocker_engine_args, normalize_mocker_config


def _ais(**extra):
    config = {"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "worker_type": "aggregated"}
    config.update(extra)
    return {"type": "external", "provider": "ais", "config": config}


def _normalize_or_skip(config):
    try:
        return normalize_mocker_config(config)
    except ValueError as e:
        if "no AIS performance data found" in str(e):
            pytest.skip("AIS data not installed (set SERVESIM_AIS_SYSTEMS)")
        raise


@pytest.mark.parametrize(
    "config, blocks, tp, dp",
    [
        ({"engine": {"timing_model": _ais()}}, 3904, 1, 1),
        ({"engine": {"block_size": 16, "timing_model": _ais()}}, 15616, 1, 1),
        ({"engine": {"timing_model": _ais(tp=2)}}, 11742, 2, 1),
        ({"engine": {"timing_model": _ais(attention_dp=2)}}, 3904, 1, 2),
        ({"gpu_memory_utilization": 0.8, "engine": {"timing_model": _ais()}}, 3001, 1, 1),
        ({"cuda_graph_reserved_bytes": 2_000_000_000, "engine": {"timing_model": _ais()}}, 3784, 1, 1),
        ({"engine": {"max_num_batched_tokens": 2048, "timing_model": _ais()}}, 3970, 1, 1),
        ({"num_gpu_blocks_is_explicit": False, "engine": {"num_gpu_blocks": 1000, "timing_model": _ais()}}, 3904, 1, 1),
        ({"engine": {"num_gpu_blocks": 1000, "timing_model": _ais()}}, 1000, 1, 1),
        ({"mem_fraction_static": 0.7, "engine": {"backend": "sglang", "timing_model": _ais(backend="sglang")}}, 142282, 1, 1),
        ({"free_gpu_memory_fraction": 0.5, "engine": {"backend": "trtllm", "timing_model": _ais(backend="trtllm")}}, 4806, 1, 1),
    ],
)
def test_ais_timing_sizes_the_kv_cache_as_dynamo_does(config, blocks, tp, dp):
    normalized = _normalize_or_skip(config)
    assert normalized["engine"]["num_gpu_blocks"] == blocks
    assert (normalized["tensor_parallel_size"], normalized["dp_size"]) == (tp, dp)


def test_ais_launch_rules_are_dynamos():
    _normalize_or_skip({"engine": {"timing_model": _ais()}})
    for config, message in [
        ({"tensor_parallel_size": 2, "engine": {"timing_model": _ais()}}, "tensor_parallel_size conflicts with canonical tp"),
        ({"engine": {"timing_model": _ais(pp=2)}}, "engine launch supports only pp=1; got pp=2"),
        ({"engine": {"worker_type": "prefill", "timing_model": _ais()}}, "AIS worker_type must match engine role"),
    ]:
        with pytest.raises(ValueError, match=message):
            normalize_mocker_config(config)


def test_ais_tp_flags_name_the_ais_config_keys():
    args = parse_args(["--model-path", "Qwen/Qwen3-32B", "--ais-perf-model", "--ais-tp-size", "2", "--ais-attention-dp-size", "2"])
    try:
        config = build_mocker_engine_args(args)
    except ValueError as e:
        if "no AIS performance data found" in str(e):
            pytest.skip("AIS data not installed (set SERVESIM_AIS_SYSTEMS)")
        raise
    timing = config["engine"]["timing_model"]["config"]
    assert (timing["tp"], timing["attention_dp"]) == (2, 2)
    assert (config["tensor_parallel_size"], config["dp_size"]) == (2, 2)


def test_router_queue_policy_reaches_the_core():
    core = json.loads(_core.normalize_mocker_config_json(json.dumps({"engine": {}, "dynamo": {"router_queue_policy": "lcfs"}})))
    assert core["dynamo"]["router_queue_policy"] == "lcfs"
    assert normalize_mocker_config({"dynamo": {"router_queue_policy": "wspt"}})["dynamo"]["router_queue_policy"] == "wspt"
