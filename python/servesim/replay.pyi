from dataclasses import dataclass
from os import PathLike
from typing import Any, Callable, Iterable, Literal, Mapping, Optional, Union, overload

_Files = Union[str, PathLike, Iterable[Union[str, PathLike]]]
_Config = Union[Mapping[str, Any], str, None]

@dataclass(frozen=True)
class TelemetryOptions:
    sample_interval_ms: float = ...
    capture_in_memory: Optional[bool] = ...
    callback: Optional[Callable[[dict[str, Any]], None]] = ...
    jsonl_path: Union[str, PathLike[str], None] = ...

@dataclass
class ReplayTelemetryDetails:
    sample_interval_ms: float
    samples: list[dict[str, Any]] = ...
    def to_dict(self) -> dict[str, Any]: ...

@dataclass
class PlannerReplayDetails:
    metadata: dict[str, Any] = ...
    ticks: list[dict[str, Any]] = ...
    scaling_events: list[Any] = ...
    lifecycle_operations: list[dict[str, Any]] = ...
    total_ticks: int = ...
    html_report_path: Optional[str] = ...
    def to_dict(self) -> dict[str, Any]: ...

@dataclass
class ReplayReport:
    summary: dict[str, Any]
    per_request: Optional[list[dict[str, Any]]]
    coverage: dict[str, Any]
    planner: Optional[PlannerReplayDetails]
    telemetry: Optional[ReplayTelemetryDetails] = ...
    def to_dict(self) -> dict[str, Any]: ...

@overload
def run_trace_replay(
    trace_files: _Files,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    agentic_lanes: Optional[int] = ...,
    replay_mode: Literal["offline"] = ...,
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    trace_block_size: Optional[int] = ...,
    trace_format: str = ...,
    trace_shared_prefix_ratio: float = ...,
    trace_num_prefix_groups: int = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    execution_model: Optional[str] = ...,
    weka_nested_timestamp_basis: Optional[str] = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> ReplayReport: ...

@overload
def run_trace_replay(
    trace_files: _Files,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    agentic_lanes: Optional[int] = ...,
    replay_mode: Literal["online"],
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    trace_block_size: Optional[int] = ...,
    trace_format: str = ...,
    trace_shared_prefix_ratio: float = ...,
    trace_num_prefix_groups: int = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    execution_model: Optional[str] = ...,
    weka_nested_timestamp_basis: Optional[str] = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> dict[str, Any]: ...

@overload
def run_trace_replay(
    trace_files: _Files,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    agentic_lanes: Optional[int] = ...,
    replay_mode: str,
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    trace_block_size: Optional[int] = ...,
    trace_format: str = ...,
    trace_shared_prefix_ratio: float = ...,
    trace_num_prefix_groups: int = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    execution_model: Optional[str] = ...,
    weka_nested_timestamp_basis: Optional[str] = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> Union[ReplayReport, dict[str, Any]]: ...

@overload
def run_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    replay_mode: Literal["offline"] = ...,
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    arrival_interval_ms: Optional[float] = ...,
    request_rate: Optional[float] = ...,
    arrival_seed: int = ...,
    turns_per_session: int = ...,
    shared_prefix_ratio: float = ...,
    num_prefix_groups: int = ...,
    inter_turn_delay_ms: float = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> ReplayReport: ...

@overload
def run_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    replay_mode: Literal["online"],
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    arrival_interval_ms: Optional[float] = ...,
    request_rate: Optional[float] = ...,
    arrival_seed: int = ...,
    turns_per_session: int = ...,
    shared_prefix_ratio: float = ...,
    num_prefix_groups: int = ...,
    inter_turn_delay_ms: float = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> dict[str, Any]: ...

@overload
def run_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *,
    extra_engine_args: _Config = ...,
    prefill_engine_args: _Config = ...,
    decode_engine_args: _Config = ...,
    router_config: Any = ...,
    ais_perf_config: Any = ...,
    num_workers: int = ...,
    num_prefill_workers: int = ...,
    num_decode_workers: int = ...,
    replay_concurrency: Optional[int] = ...,
    replay_mode: str,
    router_mode: str = ...,
    arrival_speedup_ratio: float = ...,
    arrival_interval_ms: Optional[float] = ...,
    request_rate: Optional[float] = ...,
    arrival_seed: int = ...,
    turns_per_session: int = ...,
    shared_prefix_ratio: float = ...,
    num_prefix_groups: int = ...,
    inter_turn_delay_ms: float = ...,
    report_jsonl_path: Union[str, PathLike, None] = ...,
    max_sim_time_ms: Optional[float] = ...,
    model_name: Optional[str] = ...,
    sla_ttft_ms: Optional[float] = ...,
    sla_itl_ms: Optional[float] = ...,
    sla_e2e_ms: Optional[float] = ...,
    planner_config: Any = ...,
    performance_model_metadata: Any = ...,
    benchmark_granularity: int = ...,
    capture_per_request: bool = ...,
    capture_planner_details: bool = ...,
    telemetry_options: Optional[TelemetryOptions] = ...,
    kv_event_lag_ms: Optional[float] = ...,
) -> Union[ReplayReport, dict[str, Any]]: ...
