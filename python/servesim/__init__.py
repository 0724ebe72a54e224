"""servesim: a GPU-free simulator of LLM inference serving.

``servesim.mocker`` is a drop-in for ``dynamo.mocker`` (Dynamo 1.6.1); ``servesim.replay``
holds the replay entry points (``run_trace_replay``, ``run_synthetic_trace_replay``) and the
``ReplayReport`` they return; ``servesim.llm.KvRouterConfig`` is ``dynamo.llm``'s router
configuration for their ``router_config``. The simulation runs in Rust (``servesim._core``).
"""

from servesim._core import __version__

__all__ = ["__version__"]
