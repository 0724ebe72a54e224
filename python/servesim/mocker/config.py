"""Engine-configuration helpers with the behaviour of ``dynamo.mocker.config`` (Dynamo 1.6.1).

Validation and defaults come from the Rust core's configuration reader (the same one the
replay and the CLI use); the rest is argument plumbing.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim import _core
from servesim.mocker import _schema

__all__ = [
    "normalize_mocker_config",
    "performance_config",
    "engine_limit",
    "build_mocker_engine_args",
    "load_mocker_engine_args",
    "apply_worker_engine_args_overrides",
    "build_runtime_config",
    "RuntimeConfig",
]


def normalize_mocker_config(config: Mapping[str, Any] | str | None = None) -> dict:
    """Validate a mocker configuration (canonical ``{"engine": {...}, ...}`` form, as a mapping
    or JSON text) and return it with every default filled in.

    Raises ``ValueError("invalid engine launch config: <path>: <message>")`` for unknown keys
    and bad values, ``TypeError`` for a value that is neither a mapping nor a string.
    """
    if config is None:
        config = {}
    if isinstance(config, Mapping):
        value = _plain(config)
    elif isinstance(config, str):
        try:
            value = json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    else:
        raise TypeError(f"'{type(config).__name__}' object cannot be converted to 'Mapping'")
    _check_finite(value, "")
    normalized = _schema.normalize(value)
    # The simulator must be able to run what was accepted (timing profiles, AIS models).
    core = json.loads(_core.normalize_mocker_config_json(json.dumps(_for_core(normalized))))
    if normalized["engine"].get("native_host_offload") is not None:
        # The host-offload section as Dynamo normalises it (default bandwidths filled in).
        normalized["engine"]["native_host_offload"] = core["engine"]["native_host_offload"]
    if normalized["engine"].get("g3_offload") is not None:
        # The G3 section as Dynamo normalises it: all seven keys.
        normalized["engine"]["g3_offload"] = core["engine"]["g3_offload"]
    if performance_config(normalized) is not None:
        # AIS timing decides what the launch left open: the KV capacity from GPU memory (unless
        # it was the user's), tensor parallelism, data-parallel ranks and the MTP depth.
        normalized["engine"]["num_gpu_blocks"] = core["engine"]["num_gpu_blocks"]
        if normalized["engine"]["aic_nextn"] != core["engine"]["aic_nextn"]:
            normalized["engine"]["aic_nextn"] = core["engine"]["aic_nextn"]
            normalized["engine"]["aic_nextn_accept_rates"] = core["engine"]["aic_nextn_accept_rates"]
        normalized["tensor_parallel_size"] = core["tensor_parallel_size"]
        normalized["dp_size"] = core["dp_size"]
    return normalized


def _check_finite(value: Any, path: str) -> None:
    """NaN and infinities cannot be written as JSON: the reference's ``ValueError``, naming the key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"Out of range float values are not JSON compliant: {path or 'the configuration'} is {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{path}[{i}]")


# The `dynamo` keys that change what a simulation computes; the others (ports, indexer,
# handoff timeout) only matter to a live deployment. The memory fractions stay: with AIS timing
# they size the KV cache.
_SIMULATED_DYNAMO = ("reasoning", "router_queue_policy")


def _for_core(config: dict) -> dict:
    """The parts of a normalized configuration the Rust reader takes."""
    out = {k: v for k, v in config.items() if k != "dynamo"}
    dynamo = {k: v for k, v in (config.get("dynamo") or {}).items() if k in _SIMULATED_DYNAMO and v is not None}
    if dynamo:
        out["dynamo"] = dynamo
    return out


def core_config_text(config) -> str:
    """A configuration (mapping or JSON text) validated as the reference does and rendered
    for the Rust core."""
    return json.dumps(_for_core(normalize_mocker_config(config)))


def _plain(value: Any) -> Any:
    """Mappings and sequences as JSON-ready dicts and lists (paths as strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return _plain(value.to_dict())
    return value


def performance_config(config: Mapping[str, Any]) -> dict | None:
    """The AIS/AIC timing-model configuration of a normalized config, else ``None``."""
    timing = config.get("engine", {}).get("timing_model", {})
    if timing.get("type") == "external" and timing.get("provider") in ("ais", "aic"):
        return timing["config"]
    return None


def engine_limit(config: Mapping[str, Any], name: str) -> int | None:
    """``config["engine"][name]`` (``KeyError`` for an unknown name)."""
    return config["engine"][name]


_ENGINE_FLAGS = (
    "num_gpu_blocks",
    "block_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "speedup_ratio",
    "decode_speedup_ratio",
    "kv_transfer_bandwidth",
    "kv_transfer_timing_mode",
    "preemption_mode",
)
_RENAMED = (
    ("ais_nextn", "aic_nextn"),
    ("ais_nextn_accept_rates", "aic_nextn_accept_rates"),
    ("ais_mtp_seed", "aic_mtp_seed"),
    ("kv_bytes_per_token", "kv_transfer_bytes_per_token"),
)
_SGLANG_FLAGS = (
    ("sglang_schedule_policy", "schedule_policy"),
    ("sglang_max_prefill_tokens", "max_prefill_tokens"),
    ("sglang_chunked_prefill_size", "chunked_prefill_size"),
    ("sglang_clip_max_new_tokens", "clip_max_new_tokens"),
    ("sglang_schedule_conservativeness", "schedule_conservativeness"),
)
_AIS_IDENTITY = (
    ("ais_backend", "backend"),
    ("ais_system", "system"),
    ("ais_backend_version", "backend_version"),
    ("ais_tp_size", "tp"),
    ("ais_moe_tp_size", "moe_tp_size"),
    ("ais_moe_ep_size", "moe_ep_size"),
    ("ais_attention_dp_size", "attention_dp"),
    ("ais_nextn", "nextn"),
)
_TOP_LEVEL = ("dp_size", "startup_time", "gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction")


def _worker_type(args) -> str:
    if getattr(args, "is_prefill_worker", False):
        return "prefill"
    if getattr(args, "is_decode_worker", False):
        return "decode"
    return "aggregated"


def _ais_perf_config_value(text: Any) -> dict:
    """``--ais-perf-config``: inline JSON, or a JSON/YAML file."""
    if isinstance(text, Mapping):
        return dict(text)
    s = str(text)
    if s.lstrip().startswith("{"):
        return json.loads(s)
    content = Path(s).read_text()
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        import yaml  # optional: only YAML perf configs need it

        return yaml.safe_load(content)


def _timing_model(args, worker_type: str) -> dict | None:
    get = lambda name: getattr(args, name, None)  # noqa: E731
    identity = {key: get(flag) for flag, key in _AIS_IDENTITY if get(flag) is not None}
    perf_config = get("ais_perf_config")
    ais = None
    if perf_config is not None:
        if get("ais_perf_model") or identity:
            raise ValueError("--ais-perf-config cannot be combined with flat AIS/AIC identity flags")
        ais = _ais_perf_config_value(perf_config)
        if isinstance(ais, dict):
            ais.setdefault("worker_type", worker_type)  # as the reference fills it
    elif get("ais_perf_model"):
        ais = {
            "model": get("model_path"),
            "backend": get("engine_type"),
            "system": "h200_sxm",
            "worker_type": worker_type,
            **identity,
        }
    profile = get("planner_profile_data")
    if ais is not None and profile is not None:
        raise ValueError("choose one timing provider: AIS or planner_profile_data")
    if ais is not None:
        return {"type": "external", "provider": "ais", "config": ais}
    if profile is not None:
        return {"type": "external", "provider": "dynamo_profile", "config": {"path": str(profile)}}
    return None


def build_mocker_engine_args(args: argparse.Namespace) -> dict:
    """The normalized configuration the mocker's command-line flags describe."""
    get = lambda name: getattr(args, name, None)  # noqa: E731
    worker_type = _worker_type(args)
    engine: dict[str, Any] = {name: get(name) for name in _ENGINE_FLAGS if get(name) is not None}
    engine["backend"] = get("engine_type")
    engine["worker_type"] = worker_type
    for flag, key in _RENAMED:
        if get(flag) is not None:
            engine[key] = get(flag)
    sglang = {key: get(flag) for flag, key in _SGLANG_FLAGS if get(flag) is not None}
    if sglang:
        engine["sglang"] = sglang
    if get("trtllm_capacity_scheduler_policy") is not None:
        engine["trtllm"] = {"capacity_scheduler_policy": get("trtllm_capacity_scheduler_policy")}
    timing = _timing_model(args, worker_type)
    if timing is not None:
        engine["timing_model"] = timing
    offload_controls = {
        key: get(flag)
        for flag, key in (
            ("host_offload_d2h_bandwidth_gbps", "d2h_bandwidth_gbps"),
            ("host_offload_h2d_bandwidth_gbps", "h2d_bandwidth_gbps"),
        )
        if get(flag) is not None
    }
    if get("num_host_blocks") is not None:
        engine["native_host_offload"] = {"num_host_blocks": get("num_host_blocks"), **offload_controls}
        engine["kv_cache_bytes_per_token"] = get("kv_bytes_per_token")
    elif offload_controls:
        raise ValueError("--host-offload-* flags require --num-host-blocks")
    config: dict[str, Any] = {"engine": engine}
    for name in _TOP_LEVEL:
        if get(name) is not None:
            config[name] = get(name)
    dynamo: dict[str, Any] = {"enable_local_indexer": True}
    if get("reasoning"):
        dynamo["reasoning"] = json.loads(get("reasoning"))
    if get("response_replay_trace_path"):
        dynamo["response_replay_trace_path"] = get("response_replay_trace_path")
    config["dynamo"] = dynamo
    return normalize_mocker_config(config)


def load_mocker_engine_args(args: argparse.Namespace) -> dict:
    """``--extra-engine-args`` (a JSON file, which then replaces every engine flag) or the
    configuration built from the flags."""
    path = getattr(args, "extra_engine_args", None)
    if path:
        return normalize_mocker_config(Path(path).read_text())
    return build_mocker_engine_args(args)


def apply_worker_engine_args_overrides(
    engine_args: Mapping[str, Any],
    *,
    kv_bytes_per_token: int | None = None,
    bootstrap_port: int | None = None,
    zmq_kv_events_port: int | None = None,
    zmq_replay_port: int | None = None,
    ais_mtp_seed: int | None = None,
) -> dict:
    """A per-worker copy of ``engine_args`` with ports, KV bytes per token and the MTP seed
    set, re-normalized. The input is not modified."""
    config = copy.deepcopy(dict(engine_args))
    dynamo = config.setdefault("dynamo", {})
    for key, value in (
        ("bootstrap_port", bootstrap_port),
        ("zmq_kv_events_port", zmq_kv_events_port),
        ("zmq_replay_port", zmq_replay_port),
    ):
        if value is not None:
            dynamo[key] = value
    if kv_bytes_per_token is not None:
        config["engine"]["kv_transfer_bytes_per_token"] = kv_bytes_per_token
    if ais_mtp_seed is not None:
        config["engine"]["aic_mtp_seed"] = ais_mtp_seed
    return normalize_mocker_config(config)


@dataclass
class RuntimeConfig:
    """The fields of Dynamo's ``ModelRuntimeConfig`` that the mocker sets (a plain object:
    servesim has no distributed runtime). A prefill worker with a bootstrap port names its
    disaggregated endpoint in ``bootstrap_host`` / ``bootstrap_port``, as Dynamo's does."""

    context_length: int = 0
    total_kv_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    data_parallel_size: int = 1
    enable_local_indexer: bool = False
    kv_event_publishing_enabled: bool = False
    engine_specific: dict[str, str] = field(default_factory=dict)
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None

    def set_engine_specific(self, key: str, value: str) -> None:
        self.engine_specific[key] = value

    def get_engine_specific(self, key: str) -> str | None:
        return self.engine_specific.get(key)

    def set_disaggregated_endpoint(self, bootstrap_host: str | None = None, bootstrap_port: int | None = None) -> None:
        self.bootstrap_host = bootstrap_host
        self.bootstrap_port = bootstrap_port

    @property
    def disaggregated_endpoint(self) -> tuple[str, int] | None:
        """``(bootstrap_host, bootstrap_port)`` once both are set (servesim's earlier name)."""
        if self.bootstrap_host is None or self.bootstrap_port is None:
            return None
        return (self.bootstrap_host, self.bootstrap_port)


def build_runtime_config(engine_args: Mapping[str, Any]) -> tuple[int, RuntimeConfig]:
    """``(engine.block_size, runtime config)`` for a normalized configuration."""
    engine = engine_args["engine"]
    dynamo = engine_args.get("dynamo", {})
    worker_type = engine.get("worker_type")
    decode = worker_type == "decode"
    rc = RuntimeConfig(
        context_length=engine.get("max_model_len") or 0,
        total_kv_blocks=engine.get("num_gpu_blocks"),
        max_num_seqs=engine.get("max_num_seqs"),
        max_num_batched_tokens=engine.get("max_num_batched_tokens"),
        data_parallel_size=engine_args.get("dp_size", 1),
        enable_local_indexer=bool(dynamo.get("enable_local_indexer")) and not decode,
        kv_event_publishing_enabled=bool(engine.get("enable_prefix_caching")) and not decode,
    )
    rc.set_engine_specific("output_replay_consumer", "true")
    port = dynamo.get("bootstrap_port")
    if worker_type == "prefill" and port is not None:
        host = os.environ.get("DYN_HTTP_RPC_HOST") or socket.gethostbyname(socket.gethostname())
        rc.set_disaggregated_endpoint(bootstrap_host=host, bootstrap_port=port)
    return engine["block_size"], rc
