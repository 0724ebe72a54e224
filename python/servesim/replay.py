"""Replay entry points with the signatures of ``dynamo.replay.api`` (Dynamo 1.6.1).

A replay runs on a virtual clock inside the Rust core with the GIL released; Ctrl-C raises
``KeyboardInterrupt`` and stops it within a fraction of a second. Offline runs return a
:class:`ReplayReport`. ``replay_mode="online"`` runs the same replay paced on the wall clock
(each simulated millisecond takes a wall millisecond, so the call lasts about the simulated
``duration_ms``) and returns the summary dict; its simulated numbers are the offline run's.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import Enum
from typing import Any

from servesim import _core

__all__ = [
    "ReplayReport",
    "PlannerReplayDetails",
    "ReplayTelemetryDetails",
    "TelemetryOptions",
    "run_trace_replay",
    "run_synthetic_trace_replay",
]


@dataclass(frozen=True)
class TelemetryOptions:
    """Telemetry of an offline replay: a sample every ``sample_interval_ms`` of simulated time,
    kept in the report (``capture_in_memory``; the default when neither other sink is set),
    passed to ``callback`` as a dict as the run reaches it, and/or written to ``jsonl_path``
    one JSON object a line. Samples have Dynamo 1.6.1's shape (a baseline at t = 0, one per
    interval, a last one at the end of the run); docs/telemetry.md lists their fields. The CLI's
    ``servesim predict --telemetry`` writes servesim's own per-worker series instead."""

    sample_interval_ms: float = 1000.0
    capture_in_memory: bool | None = None
    callback: Callable[[dict[str, Any]], None] | None = None
    jsonl_path: str | os.PathLike[str] | None = None


def _to_primitive(value: Any) -> Any:
    """Dataclasses, enums, mappings and sequences as plain data (what ``to_dict`` returns)."""
    if is_dataclass(value) and not isinstance(value, type):
        return _to_primitive(asdict(value))
    if isinstance(value, Enum):
        return _to_primitive(value.value)
    if isinstance(value, dict):
        return {str(k): _to_primitive(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_primitive(v) for v in value]
    return value


@dataclass
class ReplayTelemetryDetails:
    """The samples an offline replay kept in memory, in time order."""

    sample_interval_ms: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"sample_interval_ms": self.sample_interval_ms, "samples": _to_primitive(self.samples)}


@dataclass
class PlannerReplayDetails:
    """Planner-in-the-loop details: the planner's metadata, its ticks (observations and
    decisions; empty unless ``capture_planner_details``), scaling events, worker lifecycle
    operations (empty unless capturing) and tick count. servesim writes no planner HTML here
    (``html_report_path`` stays ``None``; ``servesim predict --report-html`` draws the run)."""

    metadata: dict[str, Any] = field(default_factory=dict)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    scaling_events: list[Any] = field(default_factory=list)
    lifecycle_operations: list[dict[str, Any]] = field(default_factory=list)
    total_ticks: int = 0
    html_report_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "metadata": _to_primitive(self.metadata),
            "ticks": _to_primitive(self.ticks),
            "scaling_events": _to_primitive(self.scaling_events),
            "lifecycle_operations": _to_primitive(self.lifecycle_operations),
            "total_ticks": self.total_ticks,
            "html_report_path": self.html_report_path,
        }


@dataclass
class ReplayReport:
    """What an offline replay returns: the summary, per-request records (``None`` unless
    ``capture_per_request``), coverage flags, planner details (``None`` without a planner)
    and telemetry (``None`` unless ``telemetry_options`` kept samples in memory)."""

    summary: dict[str, Any]
    per_request: list[dict[str, Any]] | None
    coverage: dict[str, Any]
    planner: PlannerReplayDetails | None
    telemetry: ReplayTelemetryDetails | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "summary": self.summary,
            "per_request": self.per_request,
            "coverage": self.coverage,
            "planner": None if self.planner is None else self.planner.to_dict(),
        }
        if self.telemetry is not None:
            out["telemetry"] = self.telemetry.to_dict()
        return out


def _config_text(value: Any, what: str) -> str | None:
    """Engine/router configuration as JSON text: a mapping, a JSON string, a path to a JSON
    file, or an object with a ``to_json``/``__dict__`` (Dynamo's ``KvRouterConfig``)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            return value
        if os.path.isfile(value):
            with open(value, encoding="utf-8") as f:
                return f.read()
        return value
    for method in ("to_json", "model_dump_json"):
        if callable(getattr(value, method, None)):
            return getattr(value, method)()
    if hasattr(value, "__dict__"):
        return json.dumps({k: v for k, v in vars(value).items() if not k.startswith("_")})
    raise TypeError(f"{what} must be a mapping, a JSON string or None")


def _normalize_trace_files(trace_files) -> list[str]:
    if isinstance(trace_files, (str, os.PathLike)):
        trace_files = [trace_files]
    return [os.fspath(p) for p in trace_files]


def _normalize_execution_model(trace_format: str, execution_model: Any) -> str | None:
    if execution_model is not None:
        if not isinstance(execution_model, str):
            raise TypeError("execution_model must be a string or None")
        execution_model = execution_model.strip()
        if not execution_model:
            raise ValueError("execution_model must be non-empty")
    if trace_format in ("weka", "agentic_mooncake", "agentic-mooncake") and execution_model is None:
        raise ValueError("agentic execution requires a configured target model")
    return execution_model


def _telemetry_kwargs(options: Any, replay_mode: str) -> dict[str, Any]:
    """``telemetry_options`` (a :class:`TelemetryOptions`, or any object with its four
    attributes) as the native run's keywords, with the reference's checks and messages."""
    if options is None:
        return {}
    capture = options.capture_in_memory
    callback = options.callback
    jsonl_path = options.jsonl_path
    if capture is None:
        capture = callback is None and jsonl_path is None
    if not capture and callback is None and jsonl_path is None:
        raise ValueError("TelemetryOptions needs at least one sink")
    if replay_mode != "offline":
        raise ValueError("replay telemetry only supports replay_mode='offline'")
    interval = options.sample_interval_ms
    if not isinstance(interval, numbers.Real):
        raise TypeError(
            f"argument 'telemetry_sample_interval_ms': must be real number, not {type(interval).__name__}"
        )
    interval = float(interval)
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError("telemetry_sample_interval_ms must be a positive finite number")
    if callback is not None and not callable(callback):
        raise TypeError("telemetry_callback must be callable or None")
    return {
        "telemetry_sample_interval_ms": interval,
        "capture_telemetry": bool(capture),
        "telemetry_callback": callback,
        "telemetry_jsonl_path": None if jsonl_path is None else os.fspath(jsonl_path),
    }


def _check_common(replay_mode, ais_perf_config):
    """The checks before the native run's (which checks the lag, ``max_sim_time_ms`` and what
    online replay does not support, with the reference's messages)."""
    if replay_mode not in ("offline", "online"):
        raise Exception(f"replay_mode must be either 'offline' or 'online', got {replay_mode!r}")
    if ais_perf_config is not None:
        raise NotImplementedError(
            "servesim takes the router's AIS load model from router_config; ais_perf_config is not supported"
        )


# The reference's summary layout (Dynamo 1.6.1, verified): these keys in this order, the
# goodput keys after ``gpu_hours`` when an SLA is set, then the latency statistics, then the
# workload's own keys (agentic graph, Weka basis). servesim's report has a few more counters
# (rejected/incomplete requests, preemptions, speculative accept length); the Python API keeps
# the reference's shape, and the CLI's ``--format json`` keeps the richer one.
_SUMMARY_HEAD = (
    "kv_eviction_policy",
    "committed_prefill_tokens",
    "num_requests",
    "completed_requests",
    "total_input_tokens",
    "total_output_tokens",
    "duration_ms",
    "wall_time_ms",
    "request_throughput_rps",
    "input_throughput_tok_s",
    "output_throughput_tok_s",
    "total_throughput_tok_s",
    "prefill_worker_seconds",
    "decode_worker_seconds",
    "prefill_gpus_per_worker",
    "decode_gpus_per_worker",
    "gpu_hours",
    "goodput_completed_requests",
    "goodput_request_throughput_rps",
    "goodput_output_throughput_tok_s",
    "power_w",
    "power_coverage",
    "processed_tokens",
    "processed_tokens_per_s",
    "processed_output_tokens_per_s",
    "prefix_cache_reused_ratio",
    "first_admission_prefix_cache_reused_ratio",
    "num_ttft_samples",
    "num_tpot_samples",
    "num_e2e_latency_samples",
) + tuple(
    f"{stat}_{metric}"
    for metric in ("ttft_ms", "ttst_ms", "tpot_ms", "itl_ms", "e2e_latency_ms", "output_token_throughput_per_user")
    for stat in ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
)
_SUMMARY_DEFAULTS = {"kv_eviction_policy": "lru", "power_w": None, "power_coverage": None}
_SUMMARY_ONLY_SERVESIM = frozenset(
    ("rejected_requests", "incomplete_requests", "num_preemptions", "decode_forwards", "mean_accept_length")
)
# Per-request keys servesim adds to the reference's record.
_RECORD_ONLY_SERVESIM = frozenset(
    ("first_admission_reused_input_tokens", "dp_rank", "route_overlap_tokens", "queue_wait_ms")
)


def _reference_summary(native: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _SUMMARY_HEAD:
        if key in native:
            out[key] = native[key]
        elif key in _SUMMARY_DEFAULTS:
            out[key] = _SUMMARY_DEFAULTS[key]
    for key, value in native.items():
        if key not in out and key not in _SUMMARY_ONLY_SERVESIM:
            out[key] = value
    return out


def _reference_record(line: str) -> dict[str, Any]:
    record = json.loads(line)
    for key in _RECORD_ONLY_SERVESIM.intersection(record):
        del record[key]
    return record


def _planner_details(planner_json: str | None, capture: bool) -> PlannerReplayDetails | None:
    if planner_json is None:
        return None
    p = json.loads(planner_json)
    return PlannerReplayDetails(
        metadata=p["metadata"],
        ticks=p["ticks"] if capture else [],
        scaling_events=p["scaling_events"],
        lifecycle_operations=p["lifecycle_operations"] if capture else [],
        total_ticks=p["total_ticks"],
    )


def _rust_number(v: float) -> str:
    """A float as Rust's ``Display`` writes it (the reference's messages): ``-1``, ``2.5``,
    ``inf``, ``NaN``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e16:
        return str(int(v))
    return repr(v)


def _real_arg(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"argument '{name}': must be real number, not {type(value).__name__}")


def _uint_arg(name: str, value: Any) -> int:
    """An unsigned integer argument, with the reference's (pyo3's) errors."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"argument '{name}': '{type(value).__name__}' object cannot be interpreted as an integer") from None
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return n


def _count_arg(name: str, value: Any) -> int | None:
    """``replay_concurrency`` / ``agentic_lanes``: None, or an integer of at least 1."""
    if value is None:
        return None
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"argument '{name}': '{type(value).__name__}' object cannot be interpreted as an integer") from None
    if not -(2**63) <= n < 2**63:
        raise OverflowError("Python int too large to convert to C long")
    if n < 1:
        raise Exception(f"{name} must be at least 1")
    return n


def _bool_arg(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"argument '{name}': '{type(value).__name__}' object cannot be converted to 'PyBool'")
    return value


def _check_sla(sla_ttft_ms, sla_itl_ms, sla_e2e_ms) -> None:
    """The reference's SLA checks, in its order: each a finite number ≥ 0 (``ValueError``),
    end-to-end exclusive of the other two, then each > 0 (``Exception``)."""
    values = {
        "ttft_ms": _real_arg("sla_ttft_ms", sla_ttft_ms),
        "itl_ms": _real_arg("sla_itl_ms", sla_itl_ms),
        "e2e_ms": _real_arg("sla_e2e_ms", sla_e2e_ms),
    }
    for key, v in values.items():
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"sla_{key} must be a finite, non-negative value, got {_rust_number(v)}")
    if values["e2e_ms"] is not None and (values["ttft_ms"] is not None or values["itl_ms"] is not None):
        raise Exception("invalid replay spec: sla.e2e_ms is mutually exclusive with sla.ttft_ms/itl_ms")
    for key, v in values.items():
        if v is not None and v <= 0:
            raise Exception(f"invalid replay spec: sla.{key} must be finite and positive, got {_rust_number(v)}")


def _report(
    summary_json: str,
    lines: list[str] | None,
    replay_mode: str,
    capture: bool,
    planner_json: str | None = None,
    capture_planner: bool = True,
    samples: list[str] | None = None,
    telemetry: dict[str, Any] | None = None,
):
    summary = _reference_summary(json.loads(summary_json))
    if replay_mode == "online":
        return summary
    per_request = None if lines is None else [_reference_record(line) for line in lines]
    planner = _planner_details(planner_json, bool(capture_planner))
    coverage = {
        "capture_per_request": bool(capture),
        "capture_planner_details": planner is not None and bool(capture_planner),
        "per_request_records": 0 if per_request is None else len(per_request),
    }
    details = None
    if samples is not None and telemetry:
        details = ReplayTelemetryDetails(
            sample_interval_ms=telemetry["telemetry_sample_interval_ms"],
            samples=[json.loads(line) for line in samples],
        )
    return ReplayReport(
        summary=summary, per_request=per_request, coverage=coverage, planner=planner, telemetry=details
    )


def _engine_text(value: Any, what: str) -> str | None:
    """Engine arguments validated with the reference's rules and messages
    (``normalize_mocker_config``), rendered for the Rust core."""
    from servesim.mocker.config import core_config_text

    text = _config_text(value, what)
    return None if text is None else core_config_text(text)


def _engine_kwargs(extra_engine_args, prefill_engine_args, decode_engine_args, router_config):
    return dict(
        extra_engine_args=_engine_text(extra_engine_args, "extra_engine_args"),
        prefill_engine_args=_engine_text(prefill_engine_args, "prefill_engine_args"),
        decode_engine_args=_engine_text(decode_engine_args, "decode_engine_args"),
        disaggregated=prefill_engine_args is not None or decode_engine_args is not None,
        router_config=_config_text(router_config, "router_config"),
    )


def run_trace_replay(
    trace_files,
    *,
    extra_engine_args=None,
    prefill_engine_args=None,
    decode_engine_args=None,
    router_config=None,
    ais_perf_config=None,
    num_workers=1,
    num_prefill_workers=1,
    num_decode_workers=1,
    replay_concurrency=None,
    agentic_lanes=None,
    replay_mode="offline",
    router_mode="round_robin",
    arrival_speedup_ratio=1.0,
    trace_block_size=None,
    trace_format="mooncake",
    trace_shared_prefix_ratio=0.0,
    trace_num_prefix_groups=0,
    report_jsonl_path=None,
    max_sim_time_ms=None,
    model_name=None,
    sla_ttft_ms=None,
    sla_itl_ms=None,
    sla_e2e_ms=None,
    planner_config=None,
    performance_model_metadata=None,
    benchmark_granularity=8,
    capture_per_request=False,
    capture_planner_details=True,
    execution_model=None,
    weka_nested_timestamp_basis=None,
    telemetry_options=None,
    kv_event_lag_ms=None,
):
    """Replay trace files through simulated workers on a virtual clock.

    Same signature, defaults and Python-side validation as Dynamo 1.6.1's
    ``dynamo.replay.api.run_trace_replay``. Prefill/decode engine args make the cluster
    disaggregated (``num_prefill_workers`` + ``num_decode_workers``). ``replay_mode="online"``
    paces the same replay on the wall clock (aggregated workers; no ``kv_event_lag_ms``,
    ``max_sim_time_ms``, telemetry or planner, as in the reference) and returns the summary
    dict, equal to the offline summary but for its wall-clock keys. ``planner_config``
    (a mapping, JSON text or a path; the keys ``servesim predict --planner-config`` takes) puts
    Dynamo's planner in the loop and fills ``ReplayReport.planner``. ``telemetry_options``
    (:class:`TelemetryOptions`, offline only) samples the cluster on the virtual clock.
    ``router_config``'s ``router_policy_config`` (a YAML path) gives the KV router its policy
    classes; ``model_name`` picks the file's profile for that model. ``ais_perf_config``
    raises ``NotImplementedError``; ``performance_model_metadata`` and
    ``benchmark_granularity`` are accepted and unused.
    """
    if isinstance(agentic_lanes, bool) or (agentic_lanes is not None and not isinstance(agentic_lanes, int)):
        raise TypeError("agentic_lanes must be an integer or None")
    if weka_nested_timestamp_basis is not None:
        if not isinstance(weka_nested_timestamp_basis, str):
            raise TypeError("weka_nested_timestamp_basis must be a string or None")
        if weka_nested_timestamp_basis not in ("auto", "absolute", "relative"):
            raise ValueError("weka_nested_timestamp_basis must be 'auto', 'absolute', or 'relative'")
        if trace_format != "weka":
            raise ValueError("weka_nested_timestamp_basis requires trace_format='weka'")
    execution_model = _normalize_execution_model(trace_format, execution_model)
    trace_files = _normalize_trace_files(trace_files)
    if capture_per_request and replay_mode == "online":
        raise ValueError(
            "capture_per_request only supports replay_mode='offline'; "
            "use report_jsonl_path for online request records"
        )
    if planner_config is not None:
        if replay_mode != "offline":
            raise ValueError("planner_config replay only supports replay_mode='offline'")
        if trace_format != "dynamo" and len(trace_files) != 1:
            raise ValueError(
                f"planner_config replay with trace_format={trace_format!r} requires exactly one trace file"
            )
        if trace_format == "dynamo" and not trace_files:
            raise ValueError("planner_config replay with trace_format='dynamo' requires at least one trace file")
    _check_common(replay_mode, ais_perf_config)
    telemetry = _telemetry_kwargs(telemetry_options, replay_mode)
    if not trace_files:
        raise Exception("trace replay requires at least one trace file")
    if trace_format != "dynamo" and len(trace_files) != 1:
        raise Exception(f"trace_format={trace_format!r} requires exactly one trace file, got {len(trace_files)}")
    capture_per_request = _bool_arg("capture_per_request", capture_per_request)
    replay_concurrency = _count_arg("replay_concurrency", replay_concurrency)
    agentic_lanes = _count_arg("agentic_lanes", agentic_lanes)
    _check_sla(sla_ttft_ms, sla_itl_ms, sla_e2e_ms)
    # As the reference: records written to a file are kept in the report too (offline).
    capture_per_request = capture_per_request or (report_jsonl_path is not None and replay_mode == "offline")
    summary, lines, planner, samples = _core.run_replay(
        trace_files,
        **_engine_kwargs(extra_engine_args, prefill_engine_args, decode_engine_args, router_config),
        num_workers=num_workers,
        num_prefill_workers=num_prefill_workers,
        num_decode_workers=num_decode_workers,
        replay_concurrency=replay_concurrency,
        agentic_lanes=agentic_lanes,
        router_mode=router_mode,
        arrival_speedup_ratio=arrival_speedup_ratio,
        trace_block_size=trace_block_size,
        trace_format=trace_format,
        trace_shared_prefix_ratio=trace_shared_prefix_ratio,
        trace_num_prefix_groups=trace_num_prefix_groups,
        execution_model=execution_model,
        weka_nested_timestamp_basis=weka_nested_timestamp_basis,
        sla_ttft_ms=sla_ttft_ms,
        sla_itl_ms=sla_itl_ms,
        sla_e2e_ms=sla_e2e_ms,
        capture_per_request=bool(capture_per_request),
        report_jsonl_path=None if report_jsonl_path is None else os.fspath(report_jsonl_path),
        kv_event_lag_ms=kv_event_lag_ms,
        max_sim_time_ms=None if max_sim_time_ms is None else float(max_sim_time_ms),
        planner_config=_config_text(planner_config, "planner_config"),
        model_name=model_name,
        online=replay_mode == "online",
        **telemetry,
    )
    return _report(
        summary, lines, replay_mode, capture_per_request, planner, capture_planner_details, samples, telemetry
    )


def run_synthetic_trace_replay(
    input_tokens,
    output_tokens,
    request_count,
    *,
    extra_engine_args=None,
    prefill_engine_args=None,
    decode_engine_args=None,
    router_config=None,
    ais_perf_config=None,
    num_workers=1,
    num_prefill_workers=1,
    num_decode_workers=1,
    replay_concurrency=None,
    replay_mode="offline",
    router_mode="round_robin",
    arrival_speedup_ratio=1.0,
    request_rate=None,
    arrival_interval_ms=None,
    arrival_seed=42,
    turns_per_session=1,
    shared_prefix_ratio=0.0,
    num_prefix_groups=0,
    inter_turn_delay_ms=0.0,
    report_jsonl_path=None,
    max_sim_time_ms=None,
    model_name=None,
    sla_ttft_ms=None,
    sla_itl_ms=None,
    sla_e2e_ms=None,
    planner_config=None,
    performance_model_metadata=None,
    benchmark_granularity=8,
    capture_per_request=False,
    capture_planner_details=True,
    telemetry_options=None,
    kv_event_lag_ms=None,
):
    """Replay generated load (``request_count`` sessions of ``input_tokens`` prompt and
    ``output_tokens`` output tokens) at ``request_rate`` (Poisson), every
    ``arrival_interval_ms``, or as a closed loop of ``replay_concurrency`` sessions.
    ``telemetry_options``, ``router_config``'s ``router_policy_config`` and
    ``replay_mode="online"`` (wall-clock pacing, returns the summary dict) work as in
    :func:`run_trace_replay`."""
    if capture_per_request and replay_mode == "online":
        raise ValueError("capture_per_request only supports replay_mode='offline'")
    if planner_config is not None and replay_mode != "offline":
        raise ValueError("planner_config replay only supports replay_mode='offline'")
    _check_common(replay_mode, ais_perf_config)
    telemetry = _telemetry_kwargs(telemetry_options, replay_mode)
    # The reference's argument types (pyo3 conversions) and its checks.
    input_tokens = _uint_arg("input_tokens", input_tokens)
    output_tokens = _uint_arg("output_tokens", output_tokens)
    request_count = _uint_arg("request_count", request_count)
    replay_concurrency = _count_arg("replay_concurrency", replay_concurrency)
    request_rate = _real_arg("request_rate", request_rate)
    arrival_interval_ms = _real_arg("arrival_interval_ms", arrival_interval_ms)
    arrival_seed = _uint_arg("arrival_seed", arrival_seed)
    turns_per_session = _uint_arg("turns_per_session", turns_per_session)
    shared_prefix_ratio = _real_arg("shared_prefix_ratio", shared_prefix_ratio)
    num_prefix_groups = _uint_arg("num_prefix_groups", num_prefix_groups)
    inter_turn_delay_ms = _real_arg("inter_turn_delay_ms", inter_turn_delay_ms)
    capture_per_request = _bool_arg("capture_per_request", capture_per_request)
    for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                        ("request_count", request_count)):
        if value < 1:
            raise Exception(f"{name} must be at least 1")
    _check_sla(sla_ttft_ms, sla_itl_ms, sla_e2e_ms)
    capture_per_request = capture_per_request or (report_jsonl_path is not None and replay_mode == "offline")
    synthetic = (
        input_tokens,
        output_tokens,
        request_count,
        request_rate,
        arrival_interval_ms,
        arrival_seed,
        # The reference runs sessions of 0 turns as single-turn sessions.
        max(1, turns_per_session),
        shared_prefix_ratio,
        num_prefix_groups,
        inter_turn_delay_ms,
    )
    if sum(x is not None for x in (replay_concurrency, request_rate, arrival_interval_ms)) != 1:
        raise Exception("synthetic replay requires exactly one of replay_concurrency, request_rate, or arrival_interval_ms")
    summary, lines, planner, samples = _core.run_replay(
        [],
        **_engine_kwargs(extra_engine_args, prefill_engine_args, decode_engine_args, router_config),
        num_workers=num_workers,
        num_prefill_workers=num_prefill_workers,
        num_decode_workers=num_decode_workers,
        replay_concurrency=replay_concurrency,
        router_mode=router_mode,
        arrival_speedup_ratio=arrival_speedup_ratio,
        sla_ttft_ms=sla_ttft_ms,
        sla_itl_ms=sla_itl_ms,
        sla_e2e_ms=sla_e2e_ms,
        capture_per_request=bool(capture_per_request),
        report_jsonl_path=None if report_jsonl_path is None else os.fspath(report_jsonl_path),
        kv_event_lag_ms=kv_event_lag_ms,
        max_sim_time_ms=None if max_sim_time_ms is None else float(max_sim_time_ms),
        synthetic=synthetic,
        planner_config=_config_text(planner_config, "planner_config"),
        model_name=model_name,
        online=replay_mode == "online",
        **telemetry,
    )
    return _report(
        summary, lines, replay_mode, capture_per_request, planner, capture_planner_details, samples, telemetry
    )
