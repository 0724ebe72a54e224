"""Native half of servesim (PyO3). Use servesim.replay / servesim.mocker instead."""

from os import PathLike
from typing import Optional, Sequence, Tuple, List, Union

__version__: str

def normalize_mocker_config_json(text: str) -> str:
    """Reads a configuration with the Rust core; returns its canonical JSON (ValueError if the
    simulator cannot run it)."""

def run_replay(
    trace_files: Sequence[Union[str, PathLike]],
    *,
    extra_engine_args: Optional[str] = None,
    prefill_engine_args: Optional[str] = None,
    decode_engine_args: Optional[str] = None,
    disaggregated: bool = False,
    router_config: Optional[str] = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    agentic_lanes: Optional[int] = None,
    router_mode: str = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    trace_block_size: Optional[int] = None,
    trace_format: str = "mooncake",
    trace_shared_prefix_ratio: float = 0.0,
    trace_num_prefix_groups: int = 0,
    execution_model: Optional[str] = None,
    weka_nested_timestamp_basis: Optional[str] = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    report_jsonl_path: Optional[Union[str, PathLike]] = None,
    kv_event_lag_ms: Optional[float] = None,
    router_seed: int = 42,
    synthetic: Optional[Tuple[int, int, int, Optional[float], Optional[float], int, int, float, int, float]] = None,
    max_sim_time_ms: Optional[float] = None,
) -> Tuple[str, Optional[List[str]]]:
    """Runs a replay with the GIL released; returns (summary JSON, per-request JSON lines or
    None). KeyboardInterrupt on Ctrl-C."""
