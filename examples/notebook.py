"""A notebook-style walk through the Python API (run as a plain script).

    python examples/notebook.py [TRACE]

Replays a Mooncake trace (default: the bundled examples/conversation.jsonl) through two
simulated vLLM workers, turns the per-request records into a DataFrame-friendly list of
flat rows, prints a few statistics, and plots a TTFT CDF when matplotlib is installed.
Swap the import for ``from dynamo.mocker import run_mocker_trace_replay`` and it runs
unchanged on Dynamo 1.6.1.
"""

import sys
from pathlib import Path

from servesim.mocker import run_mocker_trace_replay

trace = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("conversation.jsonl"))

# %% Replay
report = run_mocker_trace_replay(
    trace,
    extra_engine_args={"engine": {"block_size": 64, "num_gpu_blocks": 16384}},
    num_workers=2,
    sla_ttft_ms=500,
    capture_per_request=True,
)
s = report.summary
print(f"{s['completed_requests']} requests in {s['duration_ms'] / 1000:.1f} s simulated "
      f"({s['wall_time_ms']:.0f} ms wall); mean TTFT {s['mean_ttft_ms']:.1f} ms, "
      f"p99 TTFT {s['p99_ttft_ms']:.1f} ms, goodput {s['goodput_request_throughput_rps']:.2f} req/s")

# %% Per-request records as flat rows (pandas.DataFrame(rows) works as is)
COLUMNS = ("session_id", "turn_index", "arrival_time_ms", "ttft_ms", "itl_ms", "e2e_latency_ms",
           "input_length", "output_length", "reused_input_tokens", "decode_worker_idx", "terminal_status")
rows = [{c: r[c] for c in COLUMNS} for r in report.per_request]
print(f"{len(rows)} rows; first: {rows[0]}")

# %% TTFT CDF
ttfts = sorted(r["ttft_ms"] for r in rows if r["ttft_ms"] is not None)
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed; skipping the plot")
else:
    fig, ax = plt.subplots()
    ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))])
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    fig.savefig("ttft_cdf.png", dpi=120)
    print("wrote ttft_cdf.png")
