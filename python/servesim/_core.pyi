"""Native half of servesim (PyO3). Use servesim.replay / servesim.mocker instead."""

from os import PathLike
from typing import Callable, Dict, Optional, Sequence, Tuple, List, Union

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
    planner_config: Optional[str] = None,
    model_name: Optional[str] = None,
    telemetry_sample_interval_ms: Optional[float] = None,
    capture_telemetry: bool = False,
    telemetry_callback: Optional[Callable[[dict], None]] = None,
    telemetry_jsonl_path: Optional[Union[str, PathLike]] = None,
) -> Tuple[str, Optional[List[str]], Optional[str], Optional[List[str]]]:
    """Runs a replay with the GIL released; returns (summary JSON, per-request JSON lines or
    None, the planner's report as JSON or None, telemetry samples as JSON lines when
    capture_telemetry, else None). Telemetry is on when telemetry_sample_interval_ms is set;
    the callback gets each sample as a dict (an exception it raises stops the run and is
    re-raised). `model_name` picks the profile of the router policy file that router_config's
    router_policy_config names. KeyboardInterrupt on Ctrl-C."""

class LiveServer:
    """servesim's live server (routing frontend, OpenAI-compatible HTTP, /metrics, ZMQ KV
    events) over `num_workers` simulated workers, serving in the background of this process
    (tokio threads; the GIL is released while it starts and waits). `engine_config` is JSON the
    Rust reader takes (servesim.mocker.config.core_config_text); its worker_type sets the role.
    Port 0 picks a free port. Raises ValueError for bad options, OSError when a port is busy."""

    def __init__(
        self,
        engine_config: str,
        *,
        num_workers: int = 1,
        host: str = "127.0.0.1",
        port: int = 8000,
        worker_base_port: Optional[int] = None,
        model_path: Optional[Union[str, PathLike]] = None,
        model_name: Optional[str] = None,
        max_model_len: Optional[int] = None,
        stagger_delay: float = 0.0,
        router_mode: str = "round_robin",
        router_config: Optional[str] = None,
        router_seed: int = 42,
        zmq_kv_events_ports: Sequence[int] = ...,
        zmq_replay_ports: Sequence[int] = ...,
        zmq_event_format: str = "named",
        seed: int = 0,
        shutdown_timeout: float = 30.0,
        config_dir: Optional[Union[str, PathLike]] = None,
    ) -> None: ...
    @property
    def address(self) -> Tuple[str, int]: ...
    @property
    def url(self) -> str: ...
    @property
    def worker_addresses(self) -> List[Tuple[str, int]]: ...
    @property
    def model_name(self) -> str: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def stopped(self) -> bool: ...
    def shutdown(self, force: bool = False) -> None:
        """Starts a graceful shutdown and returns at once (idempotent); force=True ends the
        grace period now."""
    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until stopped or `timeout` seconds; True if stopped."""
    def shutdown_report(self) -> Optional[Dict[str, Union[bool, int]]]: ...
    def __enter__(self) -> "LiveServer": ...
    def __exit__(self, *args: object) -> bool: ...
