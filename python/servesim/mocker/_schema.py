"""The mocker configuration's canonical schema, checked the way the reference's Rust reader
(serde) checks it, with the same messages: field order, defaults, types, enum variants.

Kept in Python because it is configuration plumbing; the simulation reads the result through
the Rust core (``servesim._core``), which accepts this canonical form.
"""

from __future__ import annotations

import decimal
import json
import math
import os
import re
from typing import Any

__all__ = ["normalize", "ConfigPathError"]


class ConfigPathError(Exception):
    """A serde-style error at a path (``engine.block_size``)."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def _describe(v: Any) -> str:
    """serde's ``Unexpected`` rendering of a JSON value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{_float_text(v)}`"
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    if isinstance(v, (list, tuple)):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return "map"


def _float_text(v: float) -> str:
    if v == int(v) and abs(v) < 1e16:
        return f"{int(v)}.0" if abs(v) >= 1 or v == 0 else repr(v)
    return repr(v)


_UINT_MAX = {"usize": 2**64 - 1, "u64": 2**64 - 1, "u32": 2**32 - 1, "u16": 2**16 - 1}


def _uint(kind: str):
    def check(path: str, v: Any):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected {kind}")
        if v < 0 or v > _UINT_MAX[kind]:
            raise ConfigPathError(path, f"invalid value: integer `{v}`, expected {kind}")
        return v

    return check


def _f64(path: str, v: Any):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected f64")
    return float(v)


def _bool(path: str, v: Any):
    if not isinstance(v, bool):
        raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected a boolean")
    return v


def _string(path: str, v: Any):
    if not isinstance(v, str):
        raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected a string")
    return v


def _expected(names) -> str:
    names = [f"`{n}`" for n in names]
    if len(names) == 1:
        return names[0]
    if len(names) == 2:
        return f"{names[0]} or {names[1]}"
    return "one of " + ", ".join(names)


def _variant(*names: str):
    def check(path: str, v: Any):
        if not isinstance(v, str):
            raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected string or map")
        if v not in names:
            raise ConfigPathError(path, f"unknown variant `{v}`, expected {_expected(names)}")
        return v

    return check


def _optional(check):
    def opt(path: str, v: Any):
        return None if v is None else check(path, v)

    return opt


def _any(path: str, v: Any):
    return v


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _struct(path: str, value: Any, fields, struct_name: str, extra=()) -> dict:
    """Checks a map against ``fields`` ((name, check, default) in output order); keys in
    ``extra`` are accepted and kept only when given (fields skipped when unset)."""
    if value is None or not isinstance(value, (dict, list)):
        raise ConfigPathError(path, f"invalid type: {_describe(value)}, expected struct {struct_name}")
    if isinstance(value, list):
        value = {}
    known = [f[0] for f in fields] + [e[0] for e in extra]
    for key in value:
        if key not in known:
            raise ConfigPathError(_join(path, key), f"unknown field `{key}`, expected {_expected(known)}")
    out: dict[str, Any] = {}
    for name, check, default in fields:
        if name in value:
            out[name] = check(_join(path, name), value[name])
        else:
            out[name] = default() if callable(default) else default
    for name, check in extra:
        if name in value and value[name] is not None:
            out[name] = check(_join(path, name), value[name])
    return out


_SGLANG = (
    ("schedule_policy", _variant("fifo", "lpm"), "fifo"),
    ("max_prefill_tokens", _uint("usize"), 16384),
    ("chunked_prefill_size", _uint("usize"), 8192),
    ("clip_max_new_tokens", _uint("usize"), 4096),
    ("schedule_conservativeness", _f64, 1.0),
)
_TRTLLM = (("capacity_scheduler_policy", _variant("guaranteed_no_evict"), "guaranteed_no_evict"),)


def _missing(path: str, name: str):
    raise ConfigPathError(path, f"missing field `{name}`")


def _timing_model(path: str, v: Any):
    if not isinstance(v, dict):
        raise ConfigPathError(path, f"invalid type: {_describe(v)}, expected internally tagged enum")
    if "type" not in v:
        raise ConfigPathError(path, "missing field `type`")
    kind = _variant("polynomial", "fixed", "external")(_join(path, "type"), v["type"])
    if kind == "polynomial":
        return {"type": "polynomial"}
    if kind == "fixed":
        out = {"type": "fixed"}
        for name in ("prefill_ms", "decode_ms"):
            if name not in v:
                _missing(path, name)
            out[name] = _f64(_join(path, name), v[name])
        return out
    provider = v.get("provider")
    if provider is None:
        _missing(path, "provider")
    config = v.get("config", {})
    if provider == "dynamo_profile":
        npz = config.get("path") if isinstance(config, dict) else None
        if npz is not None and not isinstance(npz, str):
            raise ConfigPathError(_join(_join(path, "config"), "path"), f"invalid type: {_describe(npz)}, expected path string")
        if npz is not None and not os.path.exists(npz):
            raise _Plain(
                f"Failed to open NPZ file: {json.dumps(str(npz))}: No such file or directory (os error 2)"
            )
    return {"type": "external", "provider": provider, "config": config}


class _Plain(Exception):
    """A ``ValueError`` message without the ``invalid engine launch config`` prefix."""


def _engine_fields(backend: str):
    block_default = {"vllm": 64, "sglang": 1, "trtllm": 32}[backend]
    return (
        ("backend", _variant("vllm", "sglang", "trtllm"), "vllm"),
        ("num_gpu_blocks", _uint("usize"), 16384),
        ("block_size", _uint("usize"), block_default),
        ("max_model_len", _optional(_uint("usize")), None),
        ("max_num_seqs", _optional(_uint("usize")), 256),
        ("max_num_batched_tokens", _optional(_uint("usize")), 8192),
        ("prefill_schedule_interval", _uint("usize"), 1),
        ("prefill_decode_interval", _uint("usize"), 0),
        ("enable_prefix_caching", _bool, True),
        ("enable_chunked_prefill", _bool, True),
        ("speedup_ratio", _f64, 1.0),
        ("decode_speedup_ratio", _f64, 1.0),
        ("aic_nextn", _optional(_uint("usize")), None),
        ("aic_nextn_accept_rates", _optional(_string), None),
        ("aic_mtp_seed", _uint("u64"), 42),
        ("worker_type", _variant("aggregated", "prefill", "decode"), "aggregated"),
        ("preemption_mode", _variant("lifo", "fifo"), "lifo"),
        ("emit_kv_events", _bool, False),
        ("emit_kv_token_ids", _bool, False),
        ("kv_transfer_bytes_per_token", _optional(_uint("usize")), None),
        ("kv_transfer_bandwidth", _optional(_f64), None),
        ("kv_transfer_timing_mode", _variant("full_prompt", "destination_missing"), "full_prompt"),
        ("timing_model", _timing_model, lambda: {"type": "polynomial"}),
        ("sglang", lambda p, v: _struct(p, v, _SGLANG, "SglangConfig"), None),
        ("trtllm", lambda p, v: _struct(p, v, _TRTLLM, "TrtllmConfig"), None),
    )


_ENGINE_EXTRA = (
    ("kv_bytes_per_token", _uint("usize")),
    ("kv_cache_bytes_per_token", _uint("usize")),
    ("kv_cache_groups", _any),
    ("kv_cache_capacity_bytes", _uint("usize")),
    ("native_host_offload", _any),
    ("state_cache", _any),
    ("prefix_match_unit", _uint("usize")),
    ("g3_offload", _any),
)
# The reference lists the extra engine keys between these two in its "expected" message.
_ENGINE_KEY_ORDER = (
    "backend num_gpu_blocks block_size max_model_len max_num_seqs max_num_batched_tokens "
    "prefill_schedule_interval prefill_decode_interval enable_prefix_caching enable_chunked_prefill "
    "speedup_ratio decode_speedup_ratio aic_nextn aic_nextn_accept_rates aic_mtp_seed worker_type "
    "preemption_mode emit_kv_events emit_kv_token_ids kv_bytes_per_token kv_transfer_bytes_per_token "
    "kv_cache_bytes_per_token kv_cache_groups kv_cache_capacity_bytes native_host_offload state_cache "
    "prefix_match_unit g3_offload kv_transfer_bandwidth kv_transfer_timing_mode timing_model sglang trtllm"
).split()

_TOP = (
    ("dp_size", _uint("u32"), 1),
    ("tensor_parallel_size", _uint("usize"), 1),
    ("startup_time", _optional(_f64), None),
    ("num_gpu_blocks_is_explicit", _bool, False),
    ("gpu_memory_utilization", _optional(_f64), None),
    ("mem_fraction_static", _optional(_f64), None),
    ("free_gpu_memory_fraction", _optional(_f64), None),
    ("cuda_graph_reserved_bytes", _optional(_uint("u64")), None),
)
_TOP_KEYS = ["engine"] + [f[0] for f in _TOP]


def _reasoning(path: str, v: Any):
    if not isinstance(v, dict):
        raise _Plain(f"reasoning: invalid type: {_describe(v)}, expected struct ReasoningConfig")
    for name in ("start_thinking_token_id", "end_thinking_token_id", "thinking_ratio"):
        if name not in v:
            raise _Plain(f"reasoning: missing field `{name}`")
    out = {}
    for name in ("start_thinking_token_id", "end_thinking_token_id"):
        try:
            out[name] = _uint("u32")(name, v[name])
        except ConfigPathError as e:
            raise _Plain(f"reasoning.{name}: {e.message}") from None
    try:
        ratio = _f64("thinking_ratio", v["thinking_ratio"])
    except ConfigPathError as e:
        raise _Plain(f"reasoning.thinking_ratio: {e.message}") from None
    if not (0.0 <= ratio <= 1.0):
        raise _Plain(
            'thinking_ratio: Validation error: range [{"min": Number(0.0), "max": Number(1.0), '
            f'"value": Number({_float_text(ratio)})}}]'
        )
    out["thinking_ratio"] = ratio
    return out


_DYNAMO = (
    ("enable_local_indexer", _bool, False),
    ("bootstrap_port", _optional(_uint("u16")), None),
    ("handoff_session_timeout_ms", _uint("u64"), 300000),
    ("reasoning", _optional(_reasoning), None),
    ("response_replay_trace_path", _optional(_string), None),
    ("zmq_kv_events_port", _optional(_uint("u16")), None),
    ("zmq_replay_port", _optional(_uint("u16")), None),
    ("router_queue_policy", _optional(_variant("fcfs", "lcfs", "wspt")), None),
)


def normalize(config: Any) -> dict:
    """The canonical, defaulted configuration; raises ``ValueError`` with the reference's
    messages."""
    try:
        return _normalize(config)
    except ConfigPathError as e:
        where = f"{e.path}: " if e.path else ""
        raise ValueError(f"invalid engine launch config: {where}{e.message}") from None
    except _Plain as e:
        raise ValueError(str(e)) from None


def _normalize(config: Any) -> dict:
    if not isinstance(config, dict):
        raise _Plain("Mocker config must be an object")
    config = dict(config)
    dynamo_in = config.pop("dynamo", {})
    for key in config:
        if key not in _TOP_KEYS:
            raise ConfigPathError(key, f"unknown field `{key}`, expected {_expected(_TOP_KEYS)}")
    engine_in = config.get("engine", {})
    if engine_in is None or not isinstance(engine_in, (dict, list)):
        raise ConfigPathError("engine", f"invalid type: {_describe(engine_in)}, expected struct EngineConfigWire")
    if isinstance(engine_in, list):
        engine_in = {}
    for key in engine_in:
        if key not in _ENGINE_KEY_ORDER:
            raise ConfigPathError(
                f"engine.{key}", f"unknown field `{key}`, expected {_expected(_ENGINE_KEY_ORDER)}"
            )
    backend = _variant("vllm", "sglang", "trtllm")("engine.backend", engine_in.get("backend", "vllm"))
    engine = _struct("engine", engine_in, _engine_fields(backend), "EngineConfigWire", _ENGINE_EXTRA)
    if engine.get("kv_transfer_bytes_per_token") is None and "kv_bytes_per_token" in engine:
        engine["kv_transfer_bytes_per_token"] = engine.pop("kv_bytes_per_token")
    engine.pop("kv_bytes_per_token", None)
    for name, (check, default) in (("sglang", (_SGLANG, "SglangConfig")), ("trtllm", (_TRTLLM, "TrtllmConfig"))):
        if engine[name] is None:
            engine[name] = _struct(f"engine.{name}", {}, check, default)
    top = _struct("", {k: v for k, v in config.items() if k != "engine"}, _TOP, "MockerConfig")
    if dynamo_in is None or not isinstance(dynamo_in, dict):
        raise _Plain(f"invalid type: {_describe(dynamo_in)}, expected struct MockerRuntimeOptions")
    try:
        dynamo = _struct("", dynamo_in, _DYNAMO, "MockerRuntimeOptions")
    except ConfigPathError as e:
        raise _Plain(f"{e.path}: {e.message}") from None
    if "num_gpu_blocks" in engine_in and "num_gpu_blocks_is_explicit" not in config:
        top["num_gpu_blocks_is_explicit"] = True
    timing = engine.get("timing_model") or {}
    if timing.get("type") == "external" and timing.get("provider") in ("ais", "aic"):
        # Dynamo's launch takes what it leaves open from the AIS config (and checks the rest).
        ais = timing.get("config") or {}
        if "tensor_parallel_size" not in config:
            top["tensor_parallel_size"] = ais.get("tp") or 1
        if "dp_size" not in config:
            top["dp_size"] = ais.get("attention_dp") or 1
        # ... and the MTP depth, which then goes through the engine's own checks.
        nextn = ais.get("nextn") if isinstance(ais, dict) else None
        if engine["aic_nextn"] is None and type(nextn) is int and nextn > 0:
            engine["aic_nextn"] = nextn
    for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
        if engine.get(name) == 0:
            raise _Plain(f"{name} must be positive")
    if engine["prefill_schedule_interval"] == 0:
        raise _Plain("prefill_schedule_interval must be positive")
    if engine["prefill_schedule_interval"] != 1 and backend != "vllm":
        raise _Plain(
            "prefill_schedule_interval is supported only for backend=vllm; use prefill_decode_interval for backend=sglang"
        )
    if engine["prefill_decode_interval"] != 0 and backend != "sglang":
        raise _Plain("prefill_decode_interval is supported only for backend=sglang")
    if engine.get("max_model_len") == 0:
        raise _Plain("max_model_len must be positive")
    for name in ("speedup_ratio", "decode_speedup_ratio"):
        if not (math.isfinite(engine[name]) and engine[name] >= 0):
            raise _Plain(f"{name} must be finite and non-negative")
    unit = engine.get("prefix_match_unit")
    if unit is not None and (unit == 0 or engine["block_size"] % unit):
        raise ConfigPathError("engine", "prefix_match_unit must be a positive divisor of block_size")
    _speculative(engine)
    if top["dp_size"] == 0:
        raise _Plain("dp_size must be positive")
    if "native_host_offload" in engine:
        if backend != "vllm":
            raise _Plain("native_host_offload is supported only for backend=vllm")
        if engine.get("kv_cache_bytes_per_token") is None:
            raise _Plain(
                "native_host_offload requires kv_cache_bytes_per_token to derive the physical host block size"
            )
    _launch(top)
    if timing.get("type") == "external" and timing.get("provider") in ("ais", "aic"):
        _ais_launch(timing.get("config"), engine, top, config)
    out = {"engine": engine}
    out.update(top)
    out["dynamo"] = dynamo
    return out


_DEFAULT_ACCEPT_RATES = [0.85, 0.3, 0.0, 0.0, 0.0]
# Rust's `f64::from_str` syntax (the reference parses the rates with it): no underscores, no
# inner spaces, `inf`/`infinity`/`nan` in any case.
_RUST_FLOAT = re.compile(r"[+-]?(?:inf|infinity|nan|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)", re.IGNORECASE)


def _rust_float(v: float) -> str:
    """Rust's ``Display`` of an ``f64``: shortest round-trip digits, never an exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v):
        return ("-" if math.copysign(1.0, v) < 0 else "") + str(abs(int(v)))
    text = repr(v)
    return format(decimal.Decimal(text), "f") if "e" in text else text


def _speculative(engine: dict) -> None:
    """``aic_nextn`` and its rates, checked in the reference's order and words; the rates are
    stored as the reference stores them: ``aic_nextn`` positions, defaults when blank, Rust's
    rendering of each number."""
    nextn, rates = engine["aic_nextn"], engine["aic_nextn_accept_rates"]
    if nextn is None:
        if rates is not None:
            raise _Plain("aic_nextn_accept_rates requires aic_nextn")
        return
    if not 1 <= nextn <= 5:
        raise _Plain(f"aic_nextn must be in 1..=5, got {nextn}")
    text = rates.strip() if rates is not None else ""
    if text:
        parsed = []
        for part in text.split(","):
            item = part.strip()
            if not item:
                raise _Plain(f'invalid aic_nextn_accept_rates value {json.dumps(part)}: cannot parse float from empty string')
            if not _RUST_FLOAT.fullmatch(item):
                raise _Plain(f"invalid aic_nextn_accept_rates value {json.dumps(part)}: invalid float literal")
            parsed.append(float(item))
    else:
        parsed = list(_DEFAULT_ACCEPT_RATES)
    for i, r in enumerate(parsed):
        if not (math.isfinite(r) and 0.0 <= r <= 1.0):
            raise _Plain(f"aic_nextn_accept_rates[{i}] must be finite and in [0, 1], got {_rust_float(r)}")
    parsed = (parsed + [0.0] * nextn)[:nextn]
    if engine["decode_speedup_ratio"] != 1.0:
        raise _Plain(
            "aic_nextn requires decode_speedup_ratio=1.0 because MTP output acceleration is modeled by burst sampling"
        )
    engine["aic_nextn_accept_rates"] = ",".join(_rust_float(r) for r in parsed)


def _ais_speculation_tokens(v: Any) -> int:
    """serde's reading of ``ForwardPassSpeculationConfig`` (only ``ngram``), its messages."""
    where = "adjacently tagged enum ForwardPassSpeculationConfig"
    if isinstance(v, list):
        raise _Plain(f"invalid AIS performance config: invalid length {len(v)}, expected {where}")
    if not isinstance(v, dict):
        raise _Plain(f"invalid AIS performance config: invalid type: {_describe(v)}, expected {where}")
    for k in v:
        if k not in ("kind", "params"):
            raise _Plain(f'invalid AIS performance config: invalid value: string {json.dumps(k)}, expected "kind" or "params"')
    if "kind" not in v:
        raise _Plain("invalid AIS performance config: missing field `kind`")
    kind = v["kind"]
    if not isinstance(kind, str):
        raise _Plain(f"invalid AIS performance config: invalid type: {_describe(kind)}, expected string or map")
    if kind != "ngram":
        raise _Plain(f"invalid AIS performance config: unknown variant `{kind}`, expected `ngram`")
    if "params" not in v:
        raise _Plain("invalid AIS performance config: missing field `params`")
    params = v["params"]
    if not isinstance(params, dict):
        raise _Plain(
            f"invalid AIS performance config: invalid type: {_describe(params)}, "
            "expected struct variant ForwardPassSpeculationConfig::Ngram"
        )
    for k in params:
        if k != "num_speculative_tokens":
            raise _Plain(f"invalid AIS performance config: unknown field `{k}`, expected `num_speculative_tokens`")
    if "num_speculative_tokens" not in params:
        raise _Plain("invalid AIS performance config: missing field `num_speculative_tokens`")
    n = params["num_speculative_tokens"]
    if isinstance(n, bool) or not isinstance(n, int):
        raise _Plain(f"invalid AIS performance config: invalid type: {_describe(n)}, expected u32")
    if not 0 <= n < 2**32:
        raise _Plain(f"invalid AIS performance config: invalid value: integer `{n}`, expected u32")
    return n


def _launch(top: dict) -> None:
    """Dynamo's engine-launch checks of the deployment keys, in its order and words."""
    if top["tensor_parallel_size"] == 0:
        raise _Plain("tensor_parallel_size must be positive")
    startup = top.get("startup_time")
    if startup is not None and not (math.isfinite(startup) and startup >= 0):
        raise _Plain("startup_time must be finite and non-negative")
    for key in ("gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction"):
        value = top.get(key)
        if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise _Plain(f"{key} must be finite and in [0, 1]")


def _ais_launch(ais: Any, engine: dict, top: dict, given: dict) -> None:
    """An AIS timing config against the launch, as Dynamo's engine launch checks it (its order
    and words): pipeline parallelism, the parallel shape and the role must match; a malformed
    or invalid ``speculation`` is named, a valid ngram scheme is refused (Dynamo's engine launch
    has no ngram draft scheduler), and the MTP depths must agree. The rest of the AIS config is
    checked by the timing model itself."""
    if not isinstance(ais, dict):
        return
    spec = ais.get("speculation")
    _ais_speculation(ais, spec)
    count = lambda k: ais.get(k) if type(ais.get(k)) is int else 1  # noqa: E731
    if count("pp") != 1:
        raise _Plain(f"engine launch supports only pp=1; got pp={count('pp')}")
    if "tensor_parallel_size" in given and top["tensor_parallel_size"] != count("tp"):
        raise _Plain("tensor_parallel_size conflicts with canonical tp")
    if "dp_size" in given and top["dp_size"] != count("attention_dp"):
        raise _Plain("dp_size conflicts with canonical attention_dp")
    if ais.get("worker_type", "aggregated") != engine["worker_type"]:
        raise _Plain("AIS worker_type must match engine role")
    if spec is not None:
        raise _Plain("engine launch does not implement ngram draft scheduling")
    nextn = ais.get("nextn")
    if (nextn if type(nextn) is int else 0) != (engine["aic_nextn"] or 0):
        raise _Plain("canonical nextn conflicts with scheduler aic_nextn")


def _ais_speculation(ais: dict, spec: Any) -> None:
    """The AIS config's own checks of its draft scheme (``ForwardPassPerfModelConfig::validate``)."""
    if spec is None:
        return
    tokens = _ais_speculation_tokens(spec)
    invalid = "invalid engine config: invalid forward pass perf model config: "
    nextn = ais.get("nextn")
    if type(nextn) is int and nextn != 0:
        raise _Plain(invalid + "ngram speculation cannot be combined with nextn")
    if ais.get("backend") != "vllm":
        raise _Plain(invalid + "ngram speculation requires backend=vllm")
    if not 1 <= tokens <= 5:
        raise _Plain(invalid + "ngram num_speculative_tokens must be in 1..=5")
    if ais.get("estimation_mode") not in (None, "auto", "op_level"):
        raise _Plain(invalid + "ngram speculation requires op_level timing")
