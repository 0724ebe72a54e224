from os import PathLike
from typing import Any, Iterable, Mapping, Optional, Union

from servesim.replay import ReplayReport

__version__: str

class ReasoningConfig:
    start_thinking_token_id: int
    end_thinking_token_id: int
    thinking_ratio: float
    def __init__(self, start_thinking_token_id: int, end_thinking_token_id: int, thinking_ratio: float) -> None: ...
    def to_dict(self) -> dict[str, Any]: ...

def run_mocker_trace_replay(
    trace_files: Union[str, PathLike, Iterable[Union[str, PathLike]]],
    extra_engine_args: Union[Mapping[str, Any], str, None] = None,
    router_config: Any = None,
    num_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    router_mode: str = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    trace_block_size: Optional[int] = None,
    trace_format: str = "mooncake",
    trace_shared_prefix_ratio: float = 0.0,
    trace_num_prefix_groups: int = 0,
    model_name: Optional[str] = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    agentic_lanes: Optional[int] = None,
    execution_model: Optional[str] = None,
) -> ReplayReport: ...
