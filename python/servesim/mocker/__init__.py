"""Drop-in for ``dynamo.mocker`` (Dynamo 1.6.1): ``run_mocker_trace_replay`` and
``ReasoningConfig``; the configuration helpers are in ``servesim.mocker.config``, the argument
parser in ``servesim.mocker.args`` and the launch helpers in ``servesim.mocker.main``
(``python -m servesim.mocker`` serves live workers in-process)."""

from __future__ import annotations

import os

from servesim import __version__
from servesim.replay import ReplayReport, run_trace_replay

__all__ = ["__version__", "ReasoningConfig", "run_mocker_trace_replay"]

_U32_MAX = 2**32 - 1


def _u32(name: str, value) -> int:
    if not isinstance(value, int):
        raise TypeError(f"argument '{name}': '{type(value).__name__}' object cannot be interpreted as an integer")
    if value < 0 or value > _U32_MAX:
        raise OverflowError("out of range integral type conversion attempted")
    return int(value)


class ReasoningConfig:
    """Thinking-token boundaries around each output: ``start_thinking_token_id`` and
    ``end_thinking_token_id`` (u32) and the share of output tokens spent thinking."""

    __slots__ = ("start_thinking_token_id", "end_thinking_token_id", "thinking_ratio")

    def __init__(self, start_thinking_token_id: int, end_thinking_token_id: int, thinking_ratio: float):
        self.start_thinking_token_id = _u32("start_thinking_token_id", start_thinking_token_id)
        self.end_thinking_token_id = _u32("end_thinking_token_id", end_thinking_token_id)
        try:
            self.thinking_ratio = float(thinking_ratio)
        except (TypeError, ValueError):
            raise TypeError(
                f"argument 'thinking_ratio': must be real number, not {type(thinking_ratio).__name__}"
            ) from None

    def to_dict(self) -> dict:
        return {
            "start_thinking_token_id": self.start_thinking_token_id,
            "end_thinking_token_id": self.end_thinking_token_id,
            "thinking_ratio": self.thinking_ratio,
        }

    def __repr__(self) -> str:
        return (
            f"ReasoningConfig(start_thinking_token_id={self.start_thinking_token_id}, "
            f"end_thinking_token_id={self.end_thinking_token_id}, thinking_ratio={self.thinking_ratio})"
        )


def run_mocker_trace_replay(
    trace_files,
    extra_engine_args=None,
    router_config=None,
    num_workers=1,
    replay_concurrency=None,
    router_mode="round_robin",
    arrival_speedup_ratio=1.0,
    trace_block_size=None,
    trace_format="mooncake",
    trace_shared_prefix_ratio=0.0,
    trace_num_prefix_groups=0,
    model_name=None,
    sla_ttft_ms=None,
    sla_itl_ms=None,
    sla_e2e_ms=None,
    capture_per_request=False,
    agentic_lanes=None,
    execution_model=None,
) -> ReplayReport:
    """Replay trace files offline (virtual clock) and return a :class:`ReplayReport`.

    Same parameters, order and defaults as ``dynamo.mocker.run_mocker_trace_replay`` in
    Dynamo 1.6.1; it calls :func:`servesim.replay.run_trace_replay` with
    ``replay_mode="offline"``.
    """
    if isinstance(trace_files, (str, os.PathLike)):
        trace_files = [trace_files]
    else:
        trace_files = list(trace_files)
    return run_trace_replay(
        trace_files,
        extra_engine_args=extra_engine_args,
        router_config=router_config,
        num_workers=num_workers,
        replay_concurrency=replay_concurrency,
        agentic_lanes=agentic_lanes,
        replay_mode="offline",
        router_mode=router_mode,
        arrival_speedup_ratio=arrival_speedup_ratio,
        trace_block_size=trace_block_size,
        trace_format=trace_format,
        trace_shared_prefix_ratio=trace_shared_prefix_ratio,
        trace_num_prefix_groups=trace_num_prefix_groups,
        model_name=model_name,
        sla_ttft_ms=sla_ttft_ms,
        sla_itl_ms=sla_itl_ms,
        sla_e2e_ms=sla_e2e_ms,
        capture_per_request=capture_per_request,
        execution_model=execution_model,
    )
