#!/usr/bin/env python3
"""Differential fuzzer: servesim against the reference (NVIDIA Dynamo 1.6.1's offline replay).

It generates random valid cases in the case format of ../shared/parity/dynamo_replay.py (the
format of tests/parity/*.json), runs each through servesim and the reference, compares their
summaries, and reports which configurations disagree. It can shrink a disagreeing case to a
small ready-to-run repro and compare one case request by request.

  scripts/difffuzz.py --seed 1 --count 20                  # 20 generated cases (ids 1-000 .. 1-019)
  scripts/difffuzz.py --seed 1 --count 20 --only 7,12      # re-run two of them
  scripts/difffuzz.py --seed 1 --count 5 --dry-run         # print the generated cases only
  scripts/difffuzz.py --seed 1 --count 20 --minimise --outdir /tmp/repros
  scripts/difffuzz.py --case tests/parity/q_conversation_sglang_8w.json other.json
  scripts/difffuzz.py --findings                           # the repros of fidelity-findings.md
  scripts/difffuzz.py --minimise-case CASE.json --outdir /tmp/repros --name s1_small
  scripts/difffuzz.py --per-request CASE.json              # first request whose timeline diverges
  scripts/difffuzz.py --seed 1 --count 50 --json out.json --binary target/release/servesim

Generation. Case k of seed S is drawn from random.Random("difffuzz/S/k"), so it does not depend
on --count. A case mixes a workload (a prefix of one of the shared Mooncake traces, 5-400
lines, optionally only the prompts up to some length; or a synthetic load) with a cluster
(aggregated round robin, disaggregated, or kv_router) and engine knobs of the three backends;
KV pools range from just above the largest request to ample. SGLang's page size is the engine's
block_size (the reference rejects an `sglang.page_size` key). Trace cuts are written to
<cache-dir>/traces, never into the repository.

--speculation P draws MTP speculation on a stream of its own: an MTP depth with per-position
accept rates and an aic_mtp_seed (the depth in the AIS config's nextn for AIS-timed engines).

--engine-args P also draws Dynamo's launch path on a stream of its own: with probability P the
engines are timed by AIS (a few model/GPU pairs; mostly without num_gpu_blocks, so the cache is
sized from GPU memory, often with the backend's memory fraction), and a kv_router case gets
`dynamo.router_queue_policy` in its engine arguments. AIS cases run the reference from
../shared/parity/setup_aisimulate.sh --with-dynamo, and servesim with AISIM_REF_VENV pointing at
that venv unless set.

Running. servesim is --binary (default target/release/servesim of this checkout), with the CLI arguments of
scripts/parity.py (servesim_args). The reference runs with the venv python from
../shared/parity/setup.sh: dynamo_replay.py, or scripts/reference_replay.py for cases with
router_config, kv_event_lag_ms or a disaggregated side's dp_size (dynamo_replay.py cannot pass
them). Reference results are cached in --cache-dir keyed by the case and the trace's content, so a re-run only runs servesim.
A reference run longer than --timeout is recorded as a hang (and cached as such).

Comparison. num_requests, completed_requests (and rejected/incomplete counts where both report
them) must be equal; every other numeric summary metric both report, except wall-clock ones,
must agree within --tolerance (relative; absolute when the reference value is 0; differences up
to --abs-floor are float noise). kv_router is random in the reference (unseeded tie-breaks): it
runs --kv-runs times, servesim runs --kv-runs router seeds, and each metric's servesim range must
overlap the reference's [min, max] widened by the tolerance. A miss on a continuous metric is
then resampled with --kv-confirm runs on each side (the extremes of 5 samples of a skewed
metric often miss by chance) and the case differs only if the ranges still miss; the JSON
keeps the first verdict as `confirmed_from`. The table shows
the worst metric and the worst of scripts/parity.py's headline metrics (TTFT, ITL, E2E, reuse).

Statuses: match, differ, fail-servesim (only servesim failed), fail-reference (only the
reference failed), fail-both, hang (the reference did not finish). The exit status is 1 when a
round-robin case differs or fails only in servesim.

Minimising (--minimise: every case that differs or fails in one tool only; --minimise-all: also
fail-both and hang; --minimise-case CASE.json) keeps the mismatch (the same metric beyond
tolerance, see --minimise-metric; or the same failure with the same message modulo numbers)
while it bisects the trace prefix or the synthetic request count, resets engine and cluster
knobs one at a time (kv_router to round robin, fewer workers, knob by knob to the reference's
defaults), drops chunks and then single trace lines (synthetic: turns, prefix groups, the seed,
halved lengths), and finally shrinks num_gpu_blocks towards the least that fits. Reference runs
come from the cache where possible. The result is <outdir>/<name>.json with its trace cut as
<name>.jsonl beside it (a path relative to the case file):
  scripts/parity.py <outdir>/<name>.json --reference
  cd <outdir> && $(../shared/parity/setup.sh) .../shared/parity/dynamo_replay.py <name>.json

Per request (--per-request CASE.json): requests pair by (session_id, turn_index) when both
sides name sessions, else by (arrival, prompt length, requested output); the first
request (in simulated time) whose arrival, admission, token or hand-off timestamps, output
length or reused tokens differ is printed beside its counterpart, with the number that differ.

Python 3.11 standard library only; the reference's interpreter is only called as a subprocess.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
import parity  # noqa: E402

SHARED = parity.SHARED
TRACE_SOURCES = {
    "conv": os.path.join(SHARED, "traces", "mooncake_conversation_trace.jsonl"),
    "synth": os.path.join(SHARED, "traces", "mooncake_synthetic_trace.jsonl"),
}
DYNAMO_REPLAY = os.path.join(SHARED, "parity", "dynamo_replay.py")
REFERENCE_REPLAY = os.path.join(SCRIPTS, "reference_replay.py")
SETUP = os.path.join(SHARED, "parity", "setup.sh")
SETUP_AIS = os.path.join(SHARED, "parity", "setup_aisimulate.sh")
DEFAULT_BINARY = os.path.join(parity.ROOT, "target", "release", "servesim")
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "servesim-difffuzz")

# Summary keys that measure the host, not the simulation.
WALL_KEYS = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s", "call_wall_ms"}
# Counts that must agree exactly (when both tools report them).
EXACT_KEYS = ("num_requests", "completed_requests", "rejected_requests", "incomplete_requests")
# Reference defaults that the generator and the minimiser rely on.
DEFAULT_BLOCK_SIZE = {"vllm": 64, "trtllm": 32, "sglang": 1}
DEFAULT_NUM_GPU_BLOCKS = 16384
# Cap on the tokens (prompt + output) of one generated case, to keep reference runs short.
TOKEN_CAP = 3_000_000
# The headline metrics (scripts/parity.py's): the table also names the worst of these.
KEY_METRICS = list(parity.TOLERANCES)
STATUSES = ("match", "differ", "fail-servesim", "fail-reference", "fail-both", "hang")
# What --minimise shrinks (--minimise-all: fail-both and hang as well).
MINIMISE_STATUSES = ("differ", "fail-servesim", "fail-reference")

_log_lock = threading.Lock()


def log(msg):
    with _log_lock:
        print(msg, file=sys.stderr, flush=True)


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def sha256_text(text):
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Traces: cuts of the shared traces, and their statistics
# ---------------------------------------------------------------------------------------------

class TraceStore:
    """Trace cuts written to <cache>/traces; statistics and content hashes of trace files."""

    def __init__(self, cache_dir):
        self.dir = os.path.join(cache_dir, "traces")
        os.makedirs(self.dir, exist_ok=True)
        self._lines = {}
        self._stats = {}
        self._hashes = {}
        self._lock = threading.Lock()

    def lines(self, path):
        path = os.path.abspath(path)
        with self._lock:
            if path not in self._lines:
                with open(path) as f:
                    self._lines[path] = [l.rstrip("\n") for l in f if l.strip()]
            return self._lines[path]

    def _write(self, path, lines):
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as f:
                f.write("".join(l + "\n" for l in lines))
            os.replace(tmp, path)
        return path

    def cut(self, source, n, max_input=None):
        """The first n lines of a shared trace, of which only prompts <= max_input tokens."""
        name = f"{source}_{n}" + (f"_le{max_input}" if max_input else "")
        path = os.path.join(self.dir, name + ".jsonl")
        if not os.path.exists(path):
            lines = self.lines(TRACE_SOURCES[source])[:n]
            if max_input:
                lines = [l for l in lines if json.loads(l)["input_length"] <= max_input]
            self._write(path, lines)
        return path

    def write(self, lines, stem):
        """A trace made of these lines, named by its content."""
        digest = sha256_text("\n".join(lines))[:12]
        return self._write(os.path.join(self.dir, f"{stem}_{digest}.jsonl"), lines)

    def stats(self, path):
        """(input_length, output_length) of every request of a trace."""
        path = os.path.abspath(path)
        if path not in self._stats:
            rows = [json.loads(l) for l in self.lines(path)]
            self._stats[path] = [(r["input_length"], r["output_length"]) for r in rows]
        return self._stats[path]

    def digest(self, path):
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
        if key not in self._hashes:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._hashes[key] = h.hexdigest()
        return self._hashes[key]


class Load:
    """What the generator needs to know about a workload to size KV pools."""

    def __init__(self, max_input, max_total, requests, tokens):
        self.max_input, self.max_total, self.requests, self.tokens = max_input, max_total, requests, tokens


def load_of(case, traces):
    if case.get("trace"):
        st = traces.stats(case["trace"])
        if not st:
            return Load(1, 1, 0, 0)
        return Load(max(i for i, _ in st), max(i + o for i, o in st), len(st), sum(i + o for i, o in st))
    s = case["synthetic"]
    n = s["request_count"] * s.get("turns_per_session", 1)
    per = s["input_tokens"] + s["output_tokens"]
    return Load(s["input_tokens"], per, n, n * per)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def pick(rng, weighted):
    values, weights = zip(*weighted)
    return rng.choices(values, weights)[0]


def chance(rng, p):
    return rng.random() < p


def log_uniform_int(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def round_up(x, m):
    return -(-x // m) * m


def gen_trace_workload(rng, traces):
    source = pick(rng, [("conv", 65), ("synth", 35)])
    n = log_uniform_int(rng, 5, 400)
    max_input = rng.choice([2000, 4000, 8000, 16000, 32000]) if chance(rng, 0.45) else None
    while True:
        path = traces.cut(source, n, max_input)
        st = traces.stats(path)
        if not st:
            max_input = None
            continue
        if sum(i + o for i, o in st) <= TOKEN_CAP or n <= 5:
            return {"trace": path}
        n = max(5, n * 2 // 3)


def gen_synthetic_workload(rng):
    inp = log_uniform_int(rng, 16, 8192)
    out = log_uniform_int(rng, 1, 1024)
    turns = rng.randint(2, 4) if chance(rng, 0.25) else 1
    count = log_uniform_int(rng, 3, 300)
    count = max(1, min(count, 2_000_000 // (turns * (inp + out))))
    s = {"input_tokens": inp, "output_tokens": out, "request_count": count}
    arrival = pick(rng, [("rate", 45), ("interval", 40), ("closed", 15)])
    if arrival == "rate":
        s["request_rate"] = round(rng.uniform(0.5, 50.0), 2)
    elif arrival == "interval":
        s["arrival_interval_ms"] = round(math.exp(rng.uniform(math.log(2), math.log(2000))), 1)
    if chance(rng, 0.35):
        s["arrival_seed"] = rng.randint(0, 1000)
    if turns > 1:
        s["turns_per_session"] = turns
        if chance(rng, 0.6):
            s["inter_turn_delay_ms"] = rng.choice([0.0, 10.0, 100.0, 500.0])
    if chance(rng, 0.35):
        s["shared_prefix_ratio"] = rng.choice([0.1, 0.25, 0.5, 0.75, 0.9])
        s["num_prefix_groups"] = rng.randint(1, 8)
    case = {"synthetic": s}
    if arrival == "closed":
        case["replay_concurrency"] = rng.choice([1, 2, 4, 8, 16, 32])
    return case


def gen_block_size(rng, backend):
    if backend == "sglang":
        return pick(rng, [(None, 20), (1, 10), (16, 30), (32, 20), (64, 20)])
    return pick(rng, [(None, 20), (8, 5), (16, 25), (32, 25), (64, 25)])


def gen_num_gpu_blocks(rng, block_size, need_tokens, load, tight_weight=35):
    """From just above what the largest request needs to ample."""
    least = -(-need_tokens // block_size) + 1
    level = pick(rng, [("tight", tight_weight), ("pressured", 30), ("ample", 30), ("default", 5)])
    if level == "tight":
        return least + rng.randint(0, max(1, least // 20))
    if level == "pressured":
        return int(least * rng.uniform(1.2, 4.0))
    if level == "ample":
        return max(least * 4, int(load.tokens / block_size * rng.uniform(0.5, 3.0)))
    return max(least, DEFAULT_NUM_GPU_BLOCKS)


def gen_sglang_section(rng, block_size, load, dp):
    sg = {}
    if chance(rng, 0.4):
        sg["schedule_policy"] = pick(rng, [("lpm", 80), ("fifo", 20)])
    if chance(rng, 0.25):
        sg["max_prefill_tokens"] = max(round_up(load.max_input, 1024), rng.choice([4096, 8192, 16384, 32768]))
    if chance(rng, 0.35):
        cps = rng.choice([256, 512, 1024, 2048, 4096, 8192, 16384])
        sg["chunked_prefill_size"] = round_up(cps, block_size * dp)
    if chance(rng, 0.2):
        sg["clip_max_new_tokens"] = rng.choice([16, 64, 256, 1024])
    if chance(rng, 0.3):
        sg["schedule_conservativeness"] = rng.choice([0.3, 0.5, 0.8, 1.0, 1.3, 2.0])
    return sg


def gen_host_offload(sub, e):
    """Draws a host (G2) cache for engine `e` (its byte size of a token too) and returns it."""
    e["kv_cache_bytes_per_token"] = sub.choice([16384, 32768, 65536, 131072, 262144])
    host = {"num_host_blocks": max(1, int(e.get("num_gpu_blocks", 4096) * sub.choice([0.25, 0.5, 1, 2, 4, 16])))}
    if chance(sub, 0.7):
        host["d2h_bandwidth_gbps"] = sub.choice([0.5, 1.0, 2.0, 8.0, 32.0, 64.0])
    if chance(sub, 0.7):
        host["h2d_bandwidth_gbps"] = sub.choice([0.5, 1.0, 2.0, 8.0, 32.0, 64.0])
    if chance(sub, 0.4):
        host["latency_to_first_byte_ms"] = sub.choice([0.1, 0.5, 1.0, 2.0])
    if chance(sub, 0.3):
        # One pool for the deployment: its capacity is the pool's, its caps over all ranks.
        host["scope"] = "cluster_shared"
        host["kv_layout_id"] = "tp1"
        for key in ["shared_d2h_bandwidth_gbps", "shared_h2d_bandwidth_gbps"]:
            if chance(sub, 0.6):
                host[key] = sub.choice([0.0, 0.5, 1.0, 4.0, 16.0, 80.0])
    e["native_host_offload"] = host
    return host


def gen_disaggregated_host_offload(rng, pe, de):
    """Host offload on either side of a disaggregated vLLM cluster. Drawn from a stream of its
    own (seeded by the main stream's state, which it does not advance), so that every other draw
    of a seed stays what it was before disaggregated offload was drawn."""
    sub = random.Random(hashlib.sha256(repr(rng.getstate()).encode()).hexdigest())
    for e in (pe, de):
        if e.get("enable_prefix_caching", True) and "aic_nextn" not in e and chance(sub, 0.3):
            gen_host_offload(sub, e)
    hosts = [e.get("native_host_offload") or {} for e in (pe, de)]
    if all(h.get("scope") == "cluster_shared" for h in hosts):
        # Both sides join one pool, so they must agree on it (Dynamo refuses them otherwise);
        # each keeps its own per-rank rates and latency.
        contract = ["num_host_blocks", "kv_layout_id", "shared_d2h_bandwidth_gbps", "shared_h2d_bandwidth_gbps"]
        de["kv_cache_bytes_per_token"] = pe["kv_cache_bytes_per_token"]
        for key in contract:
            hosts[1].pop(key, None)
            if key in hosts[0]:
                hosts[1][key] = hosts[0][key]


def gen_engine(rng, backend, load, role="aggregated", block_size="draw", dp=1):
    e = {"backend": backend}
    if role != "aggregated":
        e["worker_type"] = role
    if block_size == "draw":
        block_size = gen_block_size(rng, backend)
    if block_size is not None:
        e["block_size"] = block_size
    bs = block_size or DEFAULT_BLOCK_SIZE[backend]
    need = load.max_input + 1 if role == "prefill" else load.max_total + 1
    e["num_gpu_blocks"] = gen_num_gpu_blocks(rng, bs, need, load, 35 if role == "aggregated" else 20)
    if chance(rng, 0.3):
        e["max_num_seqs"] = rng.choice([1, 2, 4, 8, 16, 32, 64, 256])
    chunked = True
    if backend != "sglang" and chance(rng, 0.15):
        chunked = False
        e["enable_chunked_prefill"] = False
    if chance(rng, 0.3) or not chunked:
        mnbt = rng.choice([256, 512, 1024, 2048, 4096, 8192, 16384])
        if not chunked:  # without chunking a prompt larger than the budget never runs
            mnbt = max(mnbt, round_up(load.max_input, 256))
        e["max_num_batched_tokens"] = mnbt
    if chance(rng, 0.2):
        e["enable_prefix_caching"] = False
    if backend == "vllm" and chance(rng, 0.35):
        e["preemption_mode"] = pick(rng, [("fifo", 85), ("lifo", 15)])
    if backend == "sglang":
        sg = gen_sglang_section(rng, bs, load, dp)
        if sg:
            e["sglang"] = sg
    if chance(rng, 0.25):
        e["timing_model"] = {"type": "fixed", "prefill_ms": round(rng.uniform(5, 100), 1),
                             "decode_ms": round(rng.uniform(1, 30), 1)}
    if chance(rng, 0.12):
        e["speedup_ratio"] = rng.choice([0.5, 1.5, 2.0, 4.0])
    if chance(rng, 0.12):
        e["decode_speedup_ratio"] = rng.choice([0.5, 1.5, 2.0, 3.0])
    if role != "prefill" and chance(rng, 0.08):  # MTP; both tools require decode_speedup_ratio 1 with it
        e.pop("decode_speedup_ratio", None)
        n = rng.randint(1, 3)
        e["aic_nextn"] = n
        if chance(rng, 0.7):
            rates = sorted((round(rng.uniform(0.3, 0.95), 2) for _ in range(n)), reverse=True)
            e["aic_nextn_accept_rates"] = ",".join(str(r) for r in rates)
    if backend == "vllm" and chance(rng, 0.05):  # servesim: vLLM only
        e["max_model_len"] = load.max_total + rng.randint(1, 4096)
    if backend == "vllm" and role == "aggregated" and e.get("enable_prefix_caching", True) and "aic_nextn" not in e:
        # Host (G2) offload (servesim models both scopes on aggregated vLLM workers).
        sub = rng
        if chance(sub, 0.3):
            host = gen_host_offload(sub, e)
            # G3 below it (both scopes, below a private or a shared host cache; Dynamo allows it
            # at dp_size 1 only).
            if dp == 1 and chance(sub, 0.35):
                g3 = {"scope": "cluster_shared" if chance(sub, 0.3) else "worker_local",
                      "num_g3_blocks": max(1, int(host["num_host_blocks"] * sub.choice([0.5, 1, 2, 4, 16])))}
                if g3["scope"] == "cluster_shared":
                    for key in ["shared_read_bandwidth_gbps", "shared_write_bandwidth_gbps"]:
                        if chance(sub, 0.5):
                            g3[key] = sub.choice([0.0, 1.0, 4.0, 16.0, 80.0])
                for key in ["read_bandwidth_gbps", "write_bandwidth_gbps"]:
                    if chance(sub, 0.6):
                        g3[key] = sub.choice([0.0, 0.5, 1.0, 4.0, 10.0, 40.0])
                if chance(sub, 0.5):
                    g3["latency_to_first_byte_ms"] = sub.choice([0.0, 0.1, 1.0, 5.0])
                e["g3_offload"] = g3
    return e


ROUTER_KNOBS = [
    ("overlap_score_weight", [0.0, 0.5, 1.0, 2.0]),
    ("overlap_score_credit", [0.0, 0.5, 1.5]),
    ("overlap_score_credit_decay", [0.1, 0.5, 1.0]),
    ("prefill_load_scale", [0.5, 2.0]),
    ("decode_active_request_weight", [1.0, 8.0]),
    ("router_temperature", [0.0, 0.3, 1.0]),
    ("router_track_active_blocks", [False]),
    ("router_assume_kv_reuse", [False]),
    ("router_track_prefill_tokens", [False]),
    ("router_queue_threshold", [0.25, 0.5, 1.0, 2.0]),
    ("router_queue_policy", ["fcfs", "lcfs", "wspt"]),
]


def gen_router(rng, case):
    case["router_mode"] = "kv_router"
    if chance(rng, 0.65):
        knobs = rng.sample(ROUTER_KNOBS, rng.randint(1, 3))
        case["router_config"] = {k: rng.choice(v) for k, v in knobs}
    if chance(rng, 0.1):
        case["kv_event_lag_ms"] = rng.choice([1.0, 5.0, 20.0])


def gen_aggregated(rng, case, backend, load, kv_router):
    weights = [(1, 10), (2, 30), (3, 15), (4, 25), (6, 10), (8, 10)] if kv_router else \
        [(1, 35), (2, 25), (3, 10), (4, 15), (6, 5), (8, 10)]
    case["num_workers"] = pick(rng, weights)
    dp = 2 if chance(rng, 0.15) else 1
    case["engine"] = gen_engine(rng, backend, load, dp=dp)
    if dp != 1:
        case["dp_size"] = dp
    if kv_router:
        gen_router(rng, case)


def gen_disaggregated(rng, case, backend, load):
    case["num_prefill_workers"] = pick(rng, [(1, 50), (2, 35), (3, 15)])
    case["num_decode_workers"] = pick(rng, [(1, 40), (2, 30), (3, 15), (4, 15)])
    bs = gen_block_size(rng, backend)
    pe = gen_engine(rng, backend, load, role="prefill", block_size=bs)
    de = gen_engine(rng, backend, load, role="decode", block_size=bs)
    if chance(rng, 0.4):
        pe["kv_transfer_bandwidth"] = rng.choice([1.0, 5.0, 25.0, 50.0, 100.0])
        pe["kv_transfer_bytes_per_token"] = rng.choice([16384, 65536, 131072, 262144])
    if chance(rng, 0.2):
        pe["kv_transfer_timing_mode"] = "destination_missing"
    case["prefill_engine"], case["decode_engine"] = pe, de
    if backend == "vllm":
        gen_disaggregated_host_offload(rng, pe, de)
    if chance(rng, 0.25):
        gen_router(rng, case)


def gen_cluster_extras(rng, case):
    is_trace = bool(case.get("trace"))
    if is_trace and chance(rng, 0.1):
        case["replay_concurrency"] = rng.choice([1, 2, 4, 8, 16, 32])
    if is_trace and "replay_concurrency" not in case and chance(rng, 0.12):
        case["arrival_speedup_ratio"] = rng.choice([0.5, 2.0, 4.0, 10.0])
    if chance(rng, 0.2):  # the reference takes either an e2e bound or TTFT/ITL bounds
        if chance(rng, 0.3):
            case["sla_e2e_ms"] = rng.choice([1000.0, 10000.0, 60000.0])
        else:
            sla = {"sla_ttft_ms": rng.choice([200.0, 1000.0, 5000.0]), "sla_itl_ms": rng.choice([10.0, 30.0, 100.0])}
            for key in rng.sample(sorted(sla), rng.randint(1, 2)):
                case[key] = sla[key]


# Models and GPUs whose AIS data serves every backend (Qwen3-32B on H200 is the engine-args
# goldens' case; the others widen the memory arithmetic: a smaller model, another GPU).
AIS_TARGETS = [("Qwen/Qwen3-32B", "h200_sxm"), ("Qwen/Qwen3-8B", "h200_sxm"), ("Qwen/Qwen3-32B", "h100_sxm")]
# The memory fraction each backend reads when its KV cache is sized from GPU memory.
MEMORY_FRACTION = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static",
                   "trtllm": "free_gpu_memory_fraction"}


def gen_engine_args(rng, case, p):
    """Dynamo's engine-argument launch path (drawn with --engine-args P): AIS timing, mostly
    without num_gpu_blocks so that the KV cache is sized from GPU memory, a memory fraction,
    and for a kv_router case `dynamo.router_queue_policy` (replacing the router config's)."""
    engines = [(k, case[k]) for k in ("engine", "prefill_engine", "decode_engine") if case.get(k) is not None]
    if engines and chance(rng, p):
        model, system = rng.choice(AIS_TARGETS)
        implicit = chance(rng, 0.8)
        for key, e in engines:
            role = {"engine": "aggregated", "prefill_engine": "prefill", "decode_engine": "decode"}[key]
            config = {"model": model, "system": system, "backend": e["backend"], "worker_type": role}
            dp = case.get("dp_size" if key == "engine" else key.replace("engine", "dp_size"), 1)
            if dp != 1:
                config["attention_dp"] = dp
            e["timing_model"] = {"type": "external", "provider": "ais", "config": config}
            # The AIS config owns the MTP depth; the engine's own would have to agree with it.
            e.pop("aic_nextn", None)
            e.pop("aic_nextn_accept_rates", None)
            if implicit:
                e.pop("num_gpu_blocks", None)
        if implicit and chance(rng, 0.6):
            backend = engines[0][1]["backend"]
            case.setdefault("launch", {})[MEMORY_FRACTION[backend]] = round(rng.uniform(0.3, 0.95), 2)
        case["reference"] = "dynamo+aisimulate"
    if case.get("router_mode") == "kv_router" and chance(rng, p):
        case.setdefault("launch", {})["dynamo"] = {"router_queue_policy": rng.choice(["fcfs", "lcfs", "wspt"])}
        rc = case.setdefault("router_config", {})
        rc.setdefault("router_queue_threshold", rng.choice([0.25, 0.5, 1.0]))


def generate_case(seed, index, traces, disagg_dp=0.0, engine_args=0.0, speculation=0.0):
    """Case `index` of `seed`: the same whatever --count is. With `disagg_dp` > 0, each side of
    a disaggregated case gets 2 attention-DP ranks with that probability, drawn from a stream of
    its own so the rest of the case is what it would have been without; `engine_args` > 0 draws
    the launch path (`gen_engine_args`) from another such stream, and `speculation` > 0 the
    speculative-decoding settings (`gen_speculation`) from a third."""
    rng = random.Random(f"difffuzz/{seed}/{index}")
    regime = pick(rng, [("aggregated", 50), ("disaggregated", 25), ("kv_router", 25)])
    if regime == "disaggregated":
        backend = pick(rng, [("vllm", 50), ("sglang", 30), ("trtllm", 20)])
    else:
        backend = pick(rng, [("vllm", 35), ("sglang", 40), ("trtllm", 25)])
    case = gen_trace_workload(rng, traces) if chance(rng, 0.6) else gen_synthetic_workload(rng)
    load = load_of(case, traces)
    if regime == "disaggregated":
        gen_disaggregated(rng, case, backend, load)
    else:
        gen_aggregated(rng, case, backend, load, regime == "kv_router")
    gen_cluster_extras(rng, case)
    if regime == "disaggregated" and disagg_dp > 0:
        dp_rng = random.Random(f"difffuzz/{seed}/{index}/disagg-dp")
        for side in ["prefill", "decode"]:
            if chance(dp_rng, disagg_dp):
                case[f"{side}_dp_size"] = 2
    gen_prefill_intervals(random.Random(f"difffuzz/{seed}/{index}/intervals"), case)
    if engine_args > 0:
        gen_engine_args(random.Random(f"difffuzz/{seed}/{index}/engine-args"), case, engine_args)
    if speculation > 0:
        gen_speculation(random.Random(f"difffuzz/{seed}/{index}/speculation"), case, speculation)
    return case


def gen_speculation(rng, case, p):
    """Speculative decoding as Dynamo's engine arguments carry it (drawn with --speculation P, on
    a stream of its own): with probability P per decoding engine, an MTP depth with per-position
    accept rates (often with a certain first position, which the reference's sampler draws no
    number for) and an `aic_mtp_seed`; an AIS-timed engine takes the depth in its timing
    config's `nextn` instead, as Dynamo's launch reads it. Engines that already speculate get a
    seed and sometimes rates."""
    for key in ("engine", "prefill_engine", "decode_engine"):
        e = case.get(key)
        if not e or key == "prefill_engine":
            continue
        timing = e.get("timing_model") or {}
        ais = timing.get("config") if timing.get("provider") in ("ais", "aic") else None
        if "aic_nextn" not in e and not chance(rng, p):
            continue
        n = e.get("aic_nextn") or rng.randint(1, 5)
        e.pop("decode_speedup_ratio", None)  # both tools require 1 with MTP
        if ais is not None:
            ais["nextn"] = n
            e.pop("aic_nextn", None)
        else:
            e["aic_nextn"] = n
        if chance(rng, 0.7):
            first = 1.0 if chance(rng, 0.3) else round(rng.uniform(0.3, 0.95), 2)
            rest = sorted((round(rng.uniform(0.0, 0.95), 2) for _ in range(rng.randint(0, n))), reverse=True)
            e["aic_nextn_accept_rates"] = ",".join(str(r) for r in [first] + rest)
        e["aic_mtp_seed"] = rng.choice([0, 1, 7, 42, 1234, 2**64 - 1, rng.randrange(2**32)])


def gen_prefill_intervals(rng, case):
    """The prefill cadences, from a stream of their own (the rest of a case is what it was
    before they were drawn): vLLM's prefill_schedule_interval, which acts only with attention DP
    (drawn more often there), and SGLang's prefill_decode_interval."""
    for section, dp_key in (("engine", "dp_size"), ("prefill_engine", "prefill_dp_size"),
                            ("decode_engine", "decode_dp_size")):
        e = case.get(section)
        if not e:
            continue
        backend = e.get("backend", "vllm")
        if backend == "vllm" and chance(rng, 0.4 if case.get(dp_key, 1) > 1 else 0.08):
            e["prefill_schedule_interval"] = rng.choice([2, 3, 4, 8])
        elif backend == "sglang" and chance(rng, 0.15):
            e["prefill_decode_interval"] = rng.choice([1, 2, 3, 5])


# ---------------------------------------------------------------------------------------------
# Describing cases
# ---------------------------------------------------------------------------------------------

def category(case):
    if case.get("router_mode") == "kv_router":
        return "kv_router"
    return "disaggregated" if case.get("prefill_engine") or case.get("decode_engine") else "aggregated"


def backend_of(case):
    e = case.get("engine") or case.get("prefill_engine") or case.get("decode_engine") or {}
    return e.get("backend", "vllm")


def describe_engine(e):
    b = e.get("backend", "vllm")
    timing = e.get("timing_model") or {}
    ais = timing.get("provider") == "ais"
    # An AIS-timed engine without num_gpu_blocks sizes its cache from GPU memory ("blkmem").
    blocks = e.get("num_gpu_blocks", "mem" if ais else DEFAULT_NUM_GPU_BLOCKS)
    parts = [f"bs{e.get('block_size', DEFAULT_BLOCK_SIZE[b])}", f"blk{blocks}"]
    if ais:
        config = timing.get("config") or {}
        parts.append(f"ais:{config.get('model', '?').split('/')[-1]}@{config.get('system', '?')}")
    short = {"max_num_seqs": "seqs", "max_num_batched_tokens": "mnbt", "speedup_ratio": "su",
             "decode_speedup_ratio": "dsu", "max_model_len": "mml", "aic_nextn": "mtp",
             "prefill_schedule_interval": "psi", "prefill_decode_interval": "pdi"}
    for key, tag in short.items():
        if key in e:
            parts.append(f"{tag}{e[key]}")
    if e.get("enable_prefix_caching") is False:
        parts.append("nopc")
    if e.get("enable_chunked_prefill") is False:
        parts.append("nochunk")
    if "preemption_mode" in e:
        parts.append(e["preemption_mode"])
    if (e.get("timing_model") or {}).get("type") == "fixed":
        parts.append("fixed")
    sg = e.get("sglang") or {}
    sg_short = {"schedule_policy": "", "max_prefill_tokens": "mpt", "chunked_prefill_size": "cps",
                "clip_max_new_tokens": "clip", "schedule_conservativeness": "cons"}
    for key, tag in sg_short.items():
        if key in sg:
            parts.append(f"{tag}{sg[key]}")
    if e.get("kv_transfer_bandwidth") is not None:
        parts.append(f"xfer{e['kv_transfer_bandwidth']:g}GB/s")
    if e.get("kv_transfer_timing_mode") == "destination_missing":
        parts.append("dmiss")
    host = e.get("native_host_offload") or {}
    if host:
        shared = "shared" if host.get("scope") == "cluster_shared" else ""
        parts.append(f"g2{shared}:{host.get('num_host_blocks')}")
    g3 = e.get("g3_offload") or {}
    if g3:
        shared = "shared" if g3.get("scope") == "cluster_shared" else ""
        parts.append(f"g3{shared}:{g3.get('num_g3_blocks')}")
    return " ".join(parts)


def describe_workload(case):
    if case.get("trace"):
        return os.path.basename(case["trace"]).removesuffix(".jsonl")
    s = case["synthetic"]
    text = f"syn {s['input_tokens']}/{s['output_tokens']}x{s['request_count']}"
    if s.get("request_rate") is not None:
        text += f"@{s['request_rate']}rps"
    if s.get("arrival_interval_ms") is not None:
        text += f"@{s['arrival_interval_ms']}ms"
    if s.get("turns_per_session", 1) > 1:
        text += f" t{s['turns_per_session']}"
        if s.get("inter_turn_delay_ms"):
            text += f"+{s['inter_turn_delay_ms']:g}ms"
    if s.get("shared_prefix_ratio"):
        text += f" spr{s['shared_prefix_ratio']}g{s.get('num_prefix_groups', 0)}"
    if "arrival_seed" in s:
        text += f" seed{s['arrival_seed']}"
    return text


def describe(case):
    parts = [backend_of(case)]
    if case.get("prefill_engine") or case.get("decode_engine"):
        parts.append(f"{case.get('num_prefill_workers', 1)}p{case.get('num_decode_workers', 1)}d")
        for side, tag in [("prefill", "P"), ("decode", "D")]:
            dp = f"dp{case[side + '_dp_size']} " if case.get(side + "_dp_size", 1) != 1 else ""
            parts.append(f"{tag}[{dp}" + describe_engine(case.get(side + "_engine") or {}) + "]")
    else:
        parts.append(f"w{case.get('num_workers', 1)}")
        if case.get("dp_size", 1) != 1:
            parts.append(f"dp{case['dp_size']}")
        parts.append(describe_engine(case.get("engine") or {}))
    if case.get("router_mode") == "kv_router":
        rc = case.get("router_config") or {}
        parts.append("kv" + ("{" + ",".join(f"{k}={v}" for k, v in rc.items()) + "}" if rc else ""))
        if case.get("kv_event_lag_ms") is not None:
            parts.append(f"lag{case['kv_event_lag_ms']:g}")
    launch = dict(case.get("launch") or {})
    policy = (launch.pop("dynamo", None) or {}).get("router_queue_policy")
    if policy:
        parts.append(f"launch-queue={policy}")
    parts.extend(f"{key}={value:g}" for key, value in launch.items())
    if case.get("replay_concurrency") is not None:
        parts.append(f"conc{case['replay_concurrency']}")
    if case.get("arrival_speedup_ratio") not in (None, 1.0):
        parts.append(f"asr{case['arrival_speedup_ratio']:g}")
    if any(case.get(k) is not None for k in ("sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms")):
        parts.append("sla")
    return " ".join(parts) + " | " + describe_workload(case)


# ---------------------------------------------------------------------------------------------
# Running servesim and the reference
# ---------------------------------------------------------------------------------------------

def error_line(stderr, servesim):
    """The first line of the error message in a failed run's stderr."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    if not lines:
        return "(no message)"
    if servesim:
        for l in lines:
            if l.lower().startswith("error"):
                return l
        return lines[0]
    for l in reversed(lines):  # a Python traceback ends with "SomeError: message"
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", l) or l.startswith("thread '"):
            return l
    return lines[-1]


def error_signature(message):
    """An error message with its numbers blanked: the class a minimised case must keep."""
    return re.sub(r"\d+(\.\d+)?", "N", message or "")


class Runner:
    """Runs cases through servesim and (cached) through the reference."""

    def __init__(self, args, traces):
        self.binary = args.binary
        self.timeout = args.timeout
        self.kv_runs = args.kv_runs
        self.kv_confirm = getattr(args, "kv_confirm", 0)
        self.tolerance = args.tolerance
        self.floor = args.abs_floor
        self.traces = traces
        self.cache_dir = os.path.join(args.cache_dir, "reference")
        self.tmp_dir = os.path.join(args.cache_dir, "tmp")
        os.makedirs(self.cache_dir, exist_ok=True)
        os.makedirs(self.tmp_dir, exist_ok=True)
        self.py = None
        self.ais_py = None
        self._servesim_extra = None

    def reference_python(self, case=None):
        """The reference's interpreter: Dynamo's venv, or for a case timed by AIS
        (`"reference": "dynamo+aisimulate"`) the venv with aisimulate beside Dynamo."""
        if case is not None and case.get("reference") == "dynamo+aisimulate":
            if self.ais_py is None:
                self.ais_py = subprocess.run([SETUP_AIS, "--with-dynamo"], check=True, capture_output=True,
                                             text=True).stdout.strip()
            return self.ais_py
        if self.py is None:
            self.py = subprocess.run([SETUP], check=True, capture_output=True, text=True).stdout.strip()
        return self.py

    def servesim_env(self, case):
        """servesim finds AIS data through AISIM_REF_VENV; point it at the reference's venv
        unless the caller chose one."""
        if case.get("reference") != "dynamo+aisimulate" or os.environ.get("AISIM_REF_VENV"):
            return None
        venv = os.path.dirname(os.path.dirname(self.reference_python(case)))
        return {**os.environ, "AISIM_REF_VENV": venv}

    def servesim_extra_args(self):
        """--threads 1 when the binary knows it (the machine is shared)."""
        if self._servesim_extra is None:
            help_text = subprocess.run([self.binary, "predict", "--help"], capture_output=True, text=True).stdout
            self._servesim_extra = ["--threads", "1"] if "--threads" in help_text else []
        return self._servesim_extra

    # -- servesim --------------------------------------------------------------------------

    def servesim(self, case, report_jsonl=None, router_seed=None):
        cmd = [self.binary] + parity.servesim_args(case) + self.servesim_extra_args()
        if router_seed is not None:
            cmd += ["--router-seed", str(router_seed)]
        if report_jsonl:
            cmd += ["--report-jsonl", report_jsonl]
        start = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout, env=self.servesim_env(case))
        except subprocess.TimeoutExpired:
            return {"status": "hang", "error": f"servesim timed out after {self.timeout:g} s", "seconds": self.timeout}
        seconds = time.perf_counter() - start
        if p.returncode != 0:
            return {"status": "fail", "error": error_line(p.stderr, True), "seconds": seconds}
        try:
            return {"status": "ok", "summary": json.loads(p.stdout), "seconds": seconds}
        except json.JSONDecodeError:
            return {"status": "fail", "error": "unparsable output: " + p.stdout[:200], "seconds": seconds}

    # -- reference -------------------------------------------------------------------------

    @staticmethod
    def reference_script(case):
        # Keys ../shared/parity/dynamo_replay.py cannot pass on.
        beyond_dynamo_replay = ["router_config", "kv_event_lag_ms", "prefill_dp_size", "decode_dp_size", "launch",
                                "reference"]
        if any(case.get(k) is not None for k in beyond_dynamo_replay):
            return REFERENCE_REPLAY
        return DYNAMO_REPLAY

    def cache_key(self, case, run):
        keyed = dict(case)
        if keyed.get("trace"):
            keyed["trace"] = {"sha256": self.traces.digest(keyed["trace"])}
        if keyed.get("traces"):
            keyed["traces"] = [{"sha256": self.traces.digest(t)} for t in keyed["traces"]]
        text = canonical({"case": keyed, "runner": os.path.basename(self.reference_script(case)), "run": run})
        return sha256_text(text)

    def write_temp_case(self, case):
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.tmp_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(case, f)
        return path

    def run_reference_process(self, case, per_request_out=None, timeout=None):
        timeout = timeout or self.timeout
        path = self.write_temp_case(case)
        cmd = [self.reference_python(case), self.reference_script(case), path]
        if per_request_out:
            cmd += ["--per-request", per_request_out]
        start = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "hang", "error": f"no result after {timeout:g} s", "timeout": timeout, "seconds": timeout}
        finally:
            os.unlink(path)
        seconds = time.perf_counter() - start
        if p.returncode < 0:  # killed from outside (OOM killer, say): not a result to cache
            return {"status": "fail", "error": f"killed by signal {-p.returncode}", "seconds": seconds,
                    "transient": True}
        if p.returncode != 0:
            return {"status": "fail", "error": error_line(p.stderr, False), "seconds": seconds}
        return {"status": "ok", "summary": json.loads(p.stdout), "seconds": seconds}

    def reference(self, case, run=0, timeout=None):
        """One reference run (run > 0: another sample of a random case), from the cache if known."""
        timeout = timeout or self.timeout
        path = os.path.join(self.cache_dir, self.cache_key(case, run) + ".json")
        if os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            if cached["status"] != "hang" or cached.get("timeout", 0) >= timeout:
                cached["cached"] = True
                return cached
        out = self.run_reference_process(case, timeout=timeout)
        if not out.get("transient"):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as f:
                json.dump(out, f)
            os.replace(tmp, path)
        out["cached"] = False
        return out

    def reference_runs(self, case, timeout=None, n=None):
        runs = [self.reference(case, 0, timeout)]
        if case.get("router_mode") == "kv_router" and runs[0]["status"] == "ok":
            runs += [self.reference(case, k, timeout) for k in range(1, n or self.kv_runs)]
        # A later run that fails or hangs classifies the case as servesim_runs does its own.
        failed = [r for r in runs if r["status"] != "ok"]
        return [failed[0]] if failed else runs

    # -- one case --------------------------------------------------------------------------

    def servesim_runs(self, case, n=None):
        """servesim's samples of a case: one, or --kv-runs router seeds for a kv_router case
        (the reference's tie-breaks are unseeded, so one sample on each side says little)."""
        if case.get("router_mode") != "kv_router":
            return [self.servesim(case)]
        runs = [self.servesim(case, router_seed=42 + k) for k in range(n or self.kv_runs)]
        failed = [r for r in runs if r["status"] != "ok"]
        return [failed[0]] if failed else runs

    def evaluate(self, case, ref_timeout=None):
        refs = self.reference_runs(case, ref_timeout)
        ours = self.servesim_runs(case)
        res = classify(ours, refs, self.tolerance, self.floor)
        if not self.needs_confirming(case, res):
            return res
        # A kv_router range miss on a continuous metric: the extreme runs of a few samples
        # each, so sample more on both sides before calling it a difference.
        first = fmt_worst(res)
        refs = self.reference_runs(case, ref_timeout, self.kv_confirm)
        ours = self.servesim_runs(case, self.kv_confirm)
        res = classify(ours, refs, self.tolerance, self.floor)
        res["confirmed_from"] = f"{first} with {self.kv_runs} runs"
        return res

    def needs_confirming(self, case, res):
        """A kv_router case that differs only on continuous metrics, when --kv-confirm asks
        for more runs than --kv-runs (a count that differs is never a sampling accident)."""
        return (case.get("router_mode") == "kv_router" and res["status"] == "differ"
                and self.kv_confirm > self.kv_runs and not any(k in EXACT_KEYS for k in res["beyond"]))


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def deviation(ours, ref):
    return abs(ours - ref) / abs(ref) if ref else abs(ours - ref)


def compared_keys(ours, refs):
    keys = [k for k, v in ours.items() if k not in WALL_KEYS and is_number(v)
            and all(is_number(r.get(k)) for r in refs)]
    return sorted(keys, key=lambda k: (k not in EXACT_KEYS, k))


def compare_one(ours, ref, tol, floor):
    """Against one reference run: [(metric, ours, ref, deviation, beyond)]. Differences up to
    `floor` (absolute) are float noise (the std of equal values, say)."""
    rows = []
    for k in compared_keys(ours, [ref]):
        dev = deviation(ours[k], ref[k]) if abs(ours[k] - ref[k]) > floor or k in EXACT_KEYS else 0.0
        beyond = ours[k] != ref[k] if k in EXACT_KEYS else dev > tol
        rows.append((k, ours[k], ref[k], dev, beyond))
    return rows


def compare_range(ours_runs, refs, tol, floor):
    """Several runs on each side (a random case): a metric agrees when servesim's [min, max]
    over its router seeds overlaps the reference's [min, max] widened by the tolerance. The
    deviation is the gap between the two ranges relative to the nearest reference bound; the
    servesim value shown is the one nearest the reference range."""
    rows = []
    for k in compared_keys(ours_runs[0], refs):
        if not all(is_number(o.get(k)) for o in ours_runs):
            continue
        lo, hi = min(r[k] for r in refs), max(r[k] for r in refs)
        xs = [o[k] for o in ours_runs]
        x = min(xs, key=lambda v: 0.0 if lo <= v <= hi else min(abs(v - lo), abs(v - hi)))
        if k in EXACT_KEYS:
            beyond = not lo <= x <= hi
        else:  # widened by the tolerance: relative, or absolute at a bound of 0
            lo_w = lo - max(tol * abs(lo) if lo else tol, floor)
            hi_w = hi + max(tol * abs(hi) if hi else tol, floor)
            beyond = not lo_w <= x <= hi_w
        dev = deviation(x, lo if x < lo else hi) if beyond else 0.0
        rows.append((k, x, (lo, hi), dev, beyond))
    return rows


def classify(ours_runs, refs, tol, floor):
    """A result: status, worst metric and deviation, the metrics beyond tolerance, errors.
    `ours_runs` is servesim's list of runs (several router seeds for a random case)."""
    if isinstance(ours_runs, dict):
        ours_runs = [ours_runs]
    ours = ours_runs[0]
    ref = refs[0]
    res = {"status": None, "worst_metric": None, "worst_dev": None, "servesim_value": None,
           "reference_value": None, "beyond": [], "servesim_error": ours.get("error"),
           "reference_error": ref.get("error"), "reference_runs": len(refs), "servesim_runs": len(ours_runs),
           "reference_cached": all(r.get("cached") for r in refs),
           "reference_seconds": sum(r.get("seconds", 0) for r in refs), "servesim_seconds": sum(o.get("seconds") or 0 for o in ours_runs)}
    if ref["status"] == "hang":
        res["status"] = "hang"
        return res
    if ours["status"] != "ok" or ref["status"] != "ok":
        res["status"] = {(False, True): "fail-servesim", (True, False): "fail-reference"}.get(
            (ours["status"] == "ok", ref["status"] == "ok"), "fail-both")
        return res
    summaries = [r["summary"] for r in refs]
    rows = compare_one(ours["summary"], summaries[0], tol, floor) if len(refs) == 1 else \
        compare_range([o["summary"] for o in ours_runs], summaries, tol, floor)
    res["rows"] = rows
    res["beyond"] = [k for k, _, _, _, beyond in rows if beyond]
    res["servesim_rejected"] = ours["summary"].get("rejected_requests", 0)
    candidates = [r for r in rows if r[4]] or rows
    if candidates:
        worst = max(candidates, key=lambda r: (r[0] in EXACT_KEYS and r[4], r[3]))
        res.update(worst_metric=worst[0], worst_dev=worst[3], servesim_value=worst[1], reference_value=worst[2])
    key_rows = [r for r in rows if r[0] in KEY_METRICS]
    if key_rows:
        key = max(key_rows, key=lambda r: r[3])
        res.update(key_metric=key[0], key_dev=key[3], key_servesim_value=key[1], key_reference_value=key[2])
    res["status"] = "differ" if res["beyond"] else "match"
    return res


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

def fmt_value(v):
    if isinstance(v, tuple):
        return f"[{fmt_value(v[0])}, {fmt_value(v[1])}]"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def fmt_worst(r):
    if r["status"] in ("fail-servesim", "fail-both"):
        return "servesim: " + (r["servesim_error"] or "")[:60]
    if r["status"] in ("fail-reference", "hang"):
        return "reference: " + (r["reference_error"] or "")[:60]
    if r["worst_metric"] is None:
        return ""
    if r["status"] == "match" and r["worst_dev"] < 1e-6:
        if r["reference_runs"] == 1:
            return "identical (up to float noise)"
        text = f"ranges overlap ({r.get('servesim_runs', 1)} servesim seeds, {r['reference_runs']} reference runs)"
        return text + (", resampled after a miss" if r.get("confirmed_from") else "")
    text = f"{r['worst_metric']} {fmt_dev(r['worst_dev'])}"
    if len(r["beyond"]) > 1:
        text += f" (+{len(r['beyond']) - 1} more)"
    if r.get("key_metric") and r["key_metric"] != r["worst_metric"] and r["key_dev"]:
        return text + f"; {r['key_metric']} {fmt_dev(r['key_dev'])} ss {fmt_value(r['key_servesim_value'])} " \
                      f"ref {fmt_value(r['key_reference_value'])}" + rejected_note(r)
    text += f" ss {fmt_value(r['servesim_value'])} ref {fmt_value(r['reference_value'])}"
    return text + rejected_note(r)


def rejected_note(r):
    """servesim rejects requests the reference aborts on; the reference has no such count."""
    return f"; servesim rejected {r['servesim_rejected']}" if r.get("servesim_rejected") else ""


def fmt_dev(dev):
    return "inf" if dev == float("inf") else f"{dev * 100:.3g}%"


def progress_line(i, n, r):
    ref = "cached" if r["reference_cached"] else f"{r['reference_seconds']:.1f}s"
    ss = f"{r['servesim_seconds']:.1f}s" if r.get("servesim_seconds") is not None else "-"
    return f"[{i + 1}/{n}] {r['id']} {r['status']}: {fmt_worst(r)}  (ref {ref}, servesim {ss})"


def print_table(results, out=sys.stdout):
    w = max([10] + [len(r["id"]) for r in results])
    print(f"{'id':{w}} {'status':15} {'worst metric; worst headline metric / error':120} config | workload", file=out)
    for r in results:
        print(f"{r['id']:{w}} {r['status']:15} {fmt_worst(r)[:120]:120} {r['description']}", file=out)


def tally(results):
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r["status"]] += 1
    return counts


def print_totals(results, out=sys.stdout):
    labels = {"match": "match", "differ": "differ", "fail-servesim": "fail-ss-only",
              "fail-reference": "fail-ref-only", "fail-both": "fail-both", "hang": "ref-hang"}
    head = f"{'':16} {'run':>5} " + " ".join(f"{labels[s]:>13}" for s in STATUSES)

    def row(name, rs):
        c = tally(rs)
        return f"{name:16} {len(rs):5} " + " ".join(f"{c[s]:13}" for s in STATUSES)

    print("\nTotals", file=out)
    print(head, file=out)
    print(row("all", results), file=out)
    for key in ("backend", "category"):
        for value in sorted({r[key] for r in results}):
            print(row(value, [r for r in results if r[key] == value]), file=out)
    failures = [r for r in results if r["status"] not in ("match", "differ")]
    if failures:
        print("\nFailures (first line of the message)", file=out)
        for r in failures:
            if r["servesim_error"]:
                print(f"  {r['id']:10} servesim:  {r['servesim_error']}", file=out)
            if r["reference_error"]:
                print(f"  {r['id']:10} reference: {r['reference_error']}", file=out)
    differing = [r for r in results if r["status"] == "differ"]
    if differing:
        print("\nMetrics beyond tolerance (headline metrics first; --json has them all)", file=out)
        for r in differing:
            names = sorted(r["beyond"], key=lambda k: (k not in EXACT_KEYS, k not in KEY_METRICS, k))
            more = f" ... ({len(names)} in all)" if len(names) > 6 else ""
            print(f"  {r['id']:10} {', '.join(names[:6])}{more}", file=out)


def gating_failure(r):
    """Round-robin cases must match and must not fail only in servesim."""
    return r["category"] != "kv_router" and r["status"] in ("differ", "fail-servesim")


def json_result(r):
    out = {k: v for k, v in r.items() if k != "rows"}
    if r.get("rows"):
        out["metrics"] = {k: {"servesim": a, "reference": b, "deviation": d if math.isfinite(d) else None,
                              "beyond": beyond} for k, a, b, d, beyond in r["rows"]}
    if out.get("worst_dev") is not None and not math.isfinite(out["worst_dev"]):
        out["worst_dev"] = None
    return out


# ---------------------------------------------------------------------------------------------
# Minimising
# ---------------------------------------------------------------------------------------------

class Minimiser:
    """Greedy shrinking of a case while its mismatch persists."""

    TOP_LEVEL_KNOBS = ["dp_size", "kv_event_lag_ms", "arrival_speedup_ratio", "sla_ttft_ms", "sla_itl_ms",
                       "sla_e2e_ms"]
    KEEP_ENGINE_KEYS = {"backend", "worker_type", "num_gpu_blocks"}

    def __init__(self, runner, traces, target, budget, ref_timeout, metric=None):
        self.runner, self.traces, self.target = runner, traces, target
        self.budget, self.ref_timeout, self.evaluations = budget, ref_timeout, 0
        self.metric = metric or self.target_metric(target)

    @staticmethod
    def target_metric(result):
        """The metric a differing case must keep beyond tolerance: an exact count if one differs,
        else the worst headline metric beyond tolerance, else the worst metric."""
        beyond = result.get("beyond") or []
        exact = [k for k in EXACT_KEYS if k in beyond]
        if exact:
            return exact[0]
        if result.get("key_metric") in beyond:
            return result["key_metric"]
        return result.get("worst_metric")

    def persists(self, case, label=""):
        if self.evaluations >= self.budget:
            return False
        self.evaluations += 1
        r = self.runner.evaluate(case, self.ref_timeout)
        t = self.target
        if t["status"] == "differ":
            ok = r["status"] == "differ" and self.metric in r["beyond"]
        else:
            ok = r["status"] == t["status"]
            if t["status"] in ("fail-servesim", "fail-both"):
                ok &= error_signature(r["servesim_error"]) == error_signature(t["servesim_error"])
            if t["status"] in ("fail-reference", "fail-both"):
                ok &= error_signature(r["reference_error"]) == error_signature(t["reference_error"])
        log(f"    minimise #{self.evaluations} {label}: {describe(case)[:100]} -> {r['status']}"
            f"{' (keeps it)' if ok else ''}")
        return ok

    def try_candidate(self, case, candidate, label=""):
        return candidate if candidate != case and self.persists(candidate, label) else case

    # -- workload --------------------------------------------------------------------------

    def with_lines(self, case, lines):
        return dict(case, trace=self.traces.write(lines, "min"))

    def bisect_prefix(self, case):
        """The shortest prefix of the trace that keeps the mismatch (assuming monotony)."""
        lines = list(self.traces.lines(case["trace"]))
        lo, hi = 1, len(lines)
        while lo < hi and self.evaluations < self.budget:
            mid = (lo + hi) // 2
            if self.persists(self.with_lines(case, lines[:mid]), f"first {mid} lines"):
                hi = mid
            else:
                lo = mid + 1
        return self.with_lines(case, lines[:hi]) if hi < len(lines) else case

    def drop_lines(self, case):
        """Drops chunks of lines, halving the chunk down to single lines."""
        lines = list(self.traces.lines(case["trace"]))
        chunk = max(1, len(lines) // 2)
        while len(lines) > 1 and self.evaluations < self.budget:
            changed, i = False, 0
            while i < len(lines) and len(lines) > 1:
                candidate = lines[:i] + lines[i + chunk:]
                if candidate and self.persists(self.with_lines(case, candidate), f"drop lines {i}+{chunk}"):
                    lines, changed = candidate, True
                else:
                    i += chunk
            if chunk == 1 and not changed:
                break
            chunk = max(1, chunk // 2)
        return self.with_lines(case, lines)

    @staticmethod
    def with_synthetic(case, **changes):
        s = dict(case["synthetic"], **changes)
        return dict(case, synthetic={k: v for k, v in s.items() if v is not None})

    def bisect_requests(self, case):
        lo, hi = 1, case["synthetic"]["request_count"]
        while lo < hi and self.evaluations < self.budget:
            mid = (lo + hi) // 2
            if self.persists(self.with_synthetic(case, request_count=mid), f"request_count {mid}"):
                hi = mid
            else:
                lo = mid + 1
        return self.with_synthetic(case, request_count=hi)

    def simplify_synthetic(self, case):
        def with_synthetic(**changes):
            return self.with_synthetic(case, **changes)  # the current `case` (a closure over it)

        for turns in range(1, case["synthetic"].get("turns_per_session", 1)):
            candidate = with_synthetic(turns_per_session=None if turns == 1 else turns,
                                       inter_turn_delay_ms=None if turns == 1 else
                                       case["synthetic"].get("inter_turn_delay_ms"))
            if self.persists(candidate, f"turns {turns}"):
                case = candidate
                break
        for drop in (("shared_prefix_ratio", "num_prefix_groups"), ("arrival_seed",), ("inter_turn_delay_ms",)):
            if any(k in case["synthetic"] for k in drop):
                case = self.try_candidate(case, with_synthetic(**{k: None for k in drop}), "drop " + "+".join(drop))
        for key in ("output_tokens", "input_tokens"):
            for _ in range(4):
                value = case["synthetic"][key] // 2
                if value < 1:
                    break
                candidate = with_synthetic(**{key: value})
                if not self.persists(candidate, f"{key} {value}"):
                    break
                case = candidate
        return case

    def bisect_workload(self, case):
        return self.bisect_prefix(case) if case.get("trace") else self.bisect_requests(case)

    def shrink_workload(self, case):
        case = self.bisect_workload(case)
        return self.drop_lines(case) if case.get("trace") else self.simplify_synthetic(case)

    # -- configuration ---------------------------------------------------------------------

    def config_candidates(self, case):
        """Simpler variants of the configuration, one knob each: (label, case)."""
        def without(*keys):
            return {k: v for k, v in case.items() if k not in keys}

        if case.get("router_mode") == "kv_router":
            yield "round_robin", without("router_mode", "router_config", "kv_event_lag_ms")
            for key in case.get("router_config") or {}:
                rc = {k: v for k, v in case["router_config"].items() if k != key}
                yield f"drop router_config.{key}", dict(case, router_config=rc) if rc else without("router_config")
        if case.get("trace") and "replay_concurrency" in case:
            yield "drop replay_concurrency", without("replay_concurrency")
        for key in self.TOP_LEVEL_KNOBS:
            if key in case:
                yield f"drop {key}", without(key)
        for key in ("num_workers", "num_prefill_workers", "num_decode_workers"):
            n = case.get(key, 1)
            for smaller in sorted({1, n - 1}):
                if 1 <= smaller < n:
                    yield f"{key} {smaller}", dict(case, **{key: smaller})
        for section in ("engine", "prefill_engine", "decode_engine"):
            e = case.get(section)
            if not e:
                continue
            for key in e.get("sglang") or {}:
                sg = {k: v for k, v in e["sglang"].items() if k != key}
                yield f"drop {section}.sglang.{key}", dict(case, **{section: dict(e, sglang=sg)}) if sg else \
                    dict(case, **{section: {k: v for k, v in e.items() if k != "sglang"}})
            for key in e:
                if key not in self.KEEP_ENGINE_KEYS and not (key == "sglang" and len(e["sglang"]) <= 1):
                    yield f"drop {section}.{key}", dict(case, **{section: {k: v for k, v in e.items() if k != key}})

    def simplify_config(self, case):
        tried = set()
        for _ in range(6):
            changed = False
            for label, candidate in self.config_candidates(case):
                key = canonical(candidate)
                if key in tried:
                    continue
                tried.add(key)
                if self.evaluations >= self.budget:
                    return case
                if self.persists(candidate, label):
                    case, changed = candidate, True
                    break  # the candidates of the simpler case
            if not changed:
                return case
        return case

    def shrink_blocks(self, case):
        load = load_of(case, self.traces)
        for section in ("engine", "prefill_engine", "decode_engine"):
            e = case.get(section)
            if not e or "num_gpu_blocks" not in e:
                continue
            bs = e.get("block_size", DEFAULT_BLOCK_SIZE[e.get("backend", "vllm")])
            need = load.max_input + 1 if e.get("worker_type") == "prefill" else load.max_total + 1
            lo, hi = -(-need // bs) + 1, e["num_gpu_blocks"]
            while lo < hi and self.evaluations < self.budget:
                mid = (lo + hi) // 2
                if self.persists(dict(case, **{section: dict(e, num_gpu_blocks=mid)}), f"{section}.num_gpu_blocks {mid}"):
                    hi = mid
                else:
                    lo = mid + 1
            case = dict(case, **{section: dict(e, num_gpu_blocks=hi)})
        return case

    def run(self, case):
        """Cheap cuts first: a shorter workload makes every later evaluation faster."""
        case = self.bisect_workload(case)
        case = self.simplify_config(case)
        case = self.shrink_workload(case)
        case = self.simplify_config(case)
        return self.shrink_blocks(case)


def write_repro(case, outdir, name, traces):
    """<outdir>/<name>.json, with its trace cut as <name>.jsonl beside it."""
    os.makedirs(outdir, exist_ok=True)
    out = dict(case)
    if case.get("trace"):
        with open(os.path.join(outdir, name + ".jsonl"), "w") as f:
            f.write("".join(l + "\n" for l in traces.lines(case["trace"])))
        out["trace"] = name + ".jsonl"
    path = os.path.join(outdir, name + ".json")
    with open(path, "w") as f:
        f.write(json.dumps(out) + "\n")
    return path


def minimise(runner, traces, item, args):
    """Shrinks item["case"] (whose result is item) and writes the repro; returns its path."""
    if item["status"] == "match":
        log(f"{item['id']}: matches; nothing to minimise")
        return None
    m = Minimiser(runner, traces, item, args.minimise_budget, args.minimise_timeout, args.minimise_metric)
    keep = f"; keeping {m.metric} beyond tolerance" if item["status"] == "differ" else ""
    log(f"minimising {item['id']} ({item['status']}: {fmt_worst(item)}{keep})")
    small = m.run(item["case"])
    name = args.name or "min_" + re.sub(r"[^A-Za-z0-9_]", "_", item["id"])
    path = write_repro(small, args.outdir, name, traces)
    final = runner.evaluate(small, args.minimise_timeout)
    log(f"  {m.evaluations} evaluations; wrote {path}: {final['status']}: {fmt_worst(final)}")
    return path


# ---------------------------------------------------------------------------------------------
# Per-request comparison
# ---------------------------------------------------------------------------------------------

TIME_FIELDS = ["arrival_time_ms", "first_admit_ms", "first_token_ms", "last_token_ms"]
DISAGG_FIELDS = ["prefill_admit_ms", "source_held_ms", "destination_reserved_ms", "destination_activated_ms",
                 "decode_admit_ms", "source_released_ms"]
COUNT_FIELDS = ["output_length", "reused_input_tokens", "decode_reused_input_tokens", "terminal_status"]
# When a count field is settled: a count that differs is dated by this timestamp.
COUNT_TIME = {"output_length": "last_token_ms", "reused_input_tokens": "first_admit_ms",
              "decode_reused_input_tokens": "decode_admit_ms", "terminal_status": "terminal_time_ms"}
SHOWN_FIELDS = TIME_FIELDS + DISAGG_FIELDS + COUNT_FIELDS + [
    "input_length", "requested_output_length", "prefill_worker_idx", "decode_worker_idx", "dp_rank",
    "admission_count", "session_id", "turn_index"]


def with_dp_rank(r):
    """The reference keeps a request's DP rank in its routing history."""
    history = r.get("routing_history") or []
    if "dp_rank" not in r and history:
        r = dict(r, dp_rank=history[0].get("dp_rank"))
    return r


def align(ours, refs):
    """Pairs of (servesim record, reference record).

    Sessions pair by (session_id, turn_index) when both sides name them. Otherwise (trace
    requests carry no session in the reference, and servesim's synthetic records name none) both
    sides are ordered by (arrival, prompt length, requested output) and paired in that order
    (servesim breaks ties by trace order)."""
    def session_key(r):
        return (r.get("session_id"), r.get("turn_index"))

    if all(r.get("session_id") is not None for r in refs + ours):
        by_key = {session_key(r): r for r in ours}
        return [(by_key.get(session_key(r)), r) for r in refs]

    def order(r):
        return (r["arrival_time_ms"], r["input_length"], r["requested_output_length"], r.get("uuid", ""))

    a, b = sorted(ours, key=order), sorted(refs, key=order)
    pairs = list(zip(a, b))
    pairs += [(x, None) for x in a[len(b):]] + [(None, y) for y in b[len(a):]]
    return pairs


def record_differences(a, b, tol_ms):
    """(time of the first difference, differing fields) of one pair."""
    if a is None or b is None:
        known = a or b
        return known["arrival_time_ms"], ["missing"]
    fields, first = [], math.inf
    for f in TIME_FIELDS + DISAGG_FIELDS:
        x, y = a.get(f), b.get(f)
        if f in DISAGG_FIELDS and (f not in a or f not in b):
            continue
        if (x is None) != (y is None) or (x is not None and abs(x - y) > tol_ms):
            fields.append(f)
            first = min(first, min(v for v in (x, y) if v is not None))
    for f in COUNT_FIELDS:
        if f in a and f in b and a[f] != b[f]:
            fields.append(f)
            times = [r.get(COUNT_TIME[f]) for r in (a, b) if r.get(COUNT_TIME[f]) is not None]
            first = min(first, min(times) if times else a["arrival_time_ms"])
    return first, fields


def print_pair(a, b, fields, out=sys.stdout):
    print(f"  {'field':28} {'servesim':>22} {'reference':>22}", file=out)
    for f in SHOWN_FIELDS:
        x = a.get(f) if a else None
        y = b.get(f) if b else None
        if x is None and y is None:
            continue
        mark = "  <--" if f in fields else ""
        print(f"  {f:28} {fmt_value(x):>22} {fmt_value(y):>22}{mark}", file=out)


def per_request(runner, case_path, args):
    case = load_case(case_path)
    with tempfile.TemporaryDirectory(dir=runner.tmp_dir) as tmp:
        ref_out, ours_out = os.path.join(tmp, "reference.json"), os.path.join(tmp, "servesim.jsonl")
        log(f"reference: {describe(case)}")
        ref = runner.run_reference_process(case, per_request_out=ref_out)
        log("servesim")
        ours = runner.servesim(case, report_jsonl=ours_out)
        if ref["status"] != "ok" or ours["status"] != "ok":
            print(f"reference: {ref['status']} {ref.get('error', '')}\nservesim: {ours['status']} {ours.get('error', '')}")
            return 1
        with open(ref_out) as f:
            refs = [with_dp_rank(r) for r in json.load(f)]
        with open(ours_out) as f:
            mine = [json.loads(l) for l in f if l.strip()]
    result = classify(ours, [ref], args.tolerance, args.abs_floor)
    print(f"summary: {result['status']}: {fmt_worst(result)}")
    if case.get("router_mode") == "kv_router":
        print("note: kv_router is random in the reference; this is one reference run")
    pairs = align(mine, refs)
    diffs = [(record_differences(a, b, args.pr_tolerance_ms), a, b) for a, b in pairs]
    diffs = [(t, fields, a, b) for (t, fields), a, b in diffs if fields]
    print(f"requests: servesim {len(mine)}, reference {len(refs)}; {len(diffs)} differ "
          f"(times beyond {args.pr_tolerance_ms:g} ms, or counts)")
    if not diffs:
        return 0
    by_field = {}
    for _, fields, _, _ in diffs:
        for f in fields:
            by_field[f] = by_field.get(f, 0) + 1
    print("differing fields: " + ", ".join(f"{f} {n}" for f, n in sorted(by_field.items(), key=lambda x: -x[1])))
    t, fields, a, b = min(diffs, key=lambda d: (d[0], (d[3] or d[2])["arrival_time_ms"]))
    print(f"\nfirst divergence at t = {t:.3f} ms ({', '.join(fields)}):")
    print_pair(a, b, fields)
    return 1


# ---------------------------------------------------------------------------------------------
# Cases from fidelity-findings.md
# ---------------------------------------------------------------------------------------------

def findings_cases(traces):
    """The minimal repros of ../shared/reference/fidelity-findings.md: (id, note, case)."""
    def conv(n, le=None):
        return traces.cut("conv", n, le)

    full = TRACE_SOURCES["conv"]
    disagg = lambda pblocks, dblocks: {  # noqa: E731
        "num_prefill_workers": 1, "num_decode_workers": 1,
        "prefill_engine": {"backend": "vllm", "block_size": 32, "num_gpu_blocks": pblocks, "worker_type": "prefill"},
        "decode_engine": {"backend": "vllm", "block_size": 32, "num_gpu_blocks": dblocks, "worker_type": "decode"}}
    return [
        ("S1-known", "S1 known case, full trace (slow)",
         {"trace": full, "num_workers": 2, "engine": {"backend": "sglang", "num_gpu_blocks": 300000}}),
        ("S1-conv26", "S1 retraction, prefix caching",
         {"trace": conv(26), "num_workers": 1, "engine": {"backend": "sglang", "num_gpu_blocks": 130000}}),
        ("S1-nopc", "S1 retraction, no prefix caching",
         {"synthetic": {"input_tokens": 512, "output_tokens": 512, "request_count": 40, "arrival_interval_ms": 20.0},
          "engine": {"backend": "sglang", "block_size": 16, "num_gpu_blocks": 600, "enable_prefix_caching": False},
          "num_workers": 1}),
        ("S2-lru", "S2 radix LRU clock",
         {"synthetic": {"input_tokens": 1024, "output_tokens": 64, "request_count": 18, "arrival_interval_ms": 20.0,
                        "shared_prefix_ratio": 0.25, "num_prefix_groups": 4},
          "engine": {"backend": "sglang", "block_size": 16, "num_gpu_blocks": 166}, "num_workers": 1}),
        ("S3-dp2", "S3 attention DP normalisation",
         {"trace": conv(2), "num_workers": 1, "dp_size": 2,
          "engine": {"backend": "sglang", "block_size": 16, "num_gpu_blocks": 100000}}),
        ("S4-seed", "S4 prefix groups ignore arrival_seed",
         {"synthetic": {"input_tokens": 1024, "output_tokens": 64, "request_count": 12, "arrival_interval_ms": 500.0,
                        "arrival_seed": 960, "shared_prefix_ratio": 0.25, "num_prefix_groups": 4},
          "engine": {"backend": "vllm", "block_size": 64, "num_gpu_blocks": 40}, "num_workers": 1}),
        ("V1-fifo", "V1 vLLM FIFO preemption",
         {"synthetic": {"input_tokens": 512, "output_tokens": 512, "request_count": 8, "arrival_interval_ms": 10.0},
          "engine": {"backend": "vllm", "block_size": 64, "num_gpu_blocks": 47, "preemption_mode": "fifo",
                     "timing_model": {"type": "fixed", "prefill_ms": 40.0, "decode_ms": 10.0}}, "num_workers": 1}),
        ("D1-stall", "D1 disaggregated false stall", dict({"trace": conv(133)}, **disagg(8000, 17155))),
        ("D2-resv", "D2 destination reservation timing", dict({"trace": conv(50)}, **disagg(20000, 6000))),
        ("H1-hang", "H1 reference hangs",
         {"trace": conv(5, 8000), "engine": {"backend": "sglang", "block_size": 32, "num_gpu_blocks": 284},
          "num_workers": 1}),
        ("C1-nochunk", "C1 SGLang enable_chunked_prefill false",
         {"trace": conv(20), "num_workers": 1,
          "engine": {"backend": "sglang", "block_size": 16, "num_gpu_blocks": 100000, "enable_chunked_prefill": False}}),
        ("C1-cons", "C1 SGLang schedule_conservativeness 1.5",
         {"trace": conv(20), "num_workers": 1,
          "engine": {"backend": "sglang", "block_size": 16, "num_gpu_blocks": 100000,
                     "sglang": {"schedule_conservativeness": 1.5}}}),
        ("C1-dpcps1", "C1 SGLang dp 2, chunked_prefill_size 1",
         {"trace": conv(20), "num_workers": 1, "dp_size": 2,
          "engine": {"backend": "sglang", "num_gpu_blocks": 1600000, "sglang": {"chunked_prefill_size": 1}}}),
        ("C1-mpt", "C1 SGLang max_prefill_tokens below the prompts",
         {"trace": conv(300), "num_workers": 1,
          "engine": {"backend": "sglang", "num_gpu_blocks": 1600000, "sglang": {"max_prefill_tokens": 1024}}}),
    ]


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

def run_items(runner, items, jobs):
    """items: dicts with id, case (and note). Returns the results in order."""
    results = [None] * len(items)

    def one(i):
        item = items[i]
        case = item["case"]
        r = runner.evaluate(case)
        r.update(id=item["id"], case=case, category=category(case), backend=backend_of(case),
                 description=(item.get("note", "") + ": " if item.get("note") else "") + describe(case))
        log(progress_line(i, len(items), r))
        results[i] = r

    if jobs <= 1:
        for i in range(len(items)):
            one(i)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, range(len(items))))
    return results


def load_case(path):
    """A case file with its trace path resolved (and without parity.py's "check" block)."""
    case = parity.resolve(path)
    case.pop("check", None)
    return case


def parse_only(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else None


def build_items(args, traces):
    if args.findings:
        return [{"id": i, "note": note, "case": case} for i, note, case in findings_cases(traces)]
    if args.case:
        return [{"id": os.path.basename(p).removesuffix(".json"), "case": load_case(p)} for p in args.case]
    indices = parse_only(args.only) or range(args.start, args.start + args.count)
    return [{"id": f"{args.seed}-{k:03d}", "case": generate_case(args.seed, k, traces, args.disagg_dp, args.engine_args,
                                                                args.speculation)} for k in indices]


def wait_for_binary(path, seconds=900):
    deadline = time.time() + seconds
    while not os.access(path, os.X_OK):
        if time.time() > deadline:
            sys.exit(f"servesim binary {path} not found")
        log(f"waiting for {path} ...")
        time.sleep(15)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to run")
    what.add_argument("--seed", type=int, default=1)
    what.add_argument("--count", type=int, default=20, help="generated cases (default 20)")
    what.add_argument("--start", type=int, default=0, help="index of the first generated case")
    what.add_argument("--only", help="comma-separated indices of generated cases to run")
    what.add_argument("--case", nargs="+", metavar="CASE.json", help="run these case files instead")
    what.add_argument("--findings", action="store_true", help="run the repros of fidelity-findings.md")
    what.add_argument("--per-request", metavar="CASE.json", help="compare one case request by request")
    what.add_argument("--minimise-case", metavar="CASE.json", help="minimise this case")
    what.add_argument("--dry-run", action="store_true", help="print the cases (JSON lines) and stop")
    what.add_argument("--disagg-dp", type=float, default=0.0, metavar="P",
                      help="give each side of a disaggregated case 2 attention-DP ranks with probability P "
                           "(default 0: the cases of earlier runs)")
    what.add_argument("--engine-args", type=float, default=0.0, metavar="P",
                      help="with probability P each, time a case's engines with AIS (mostly without "
                           "num_gpu_blocks, with a memory fraction) and give a kv_router case "
                           "dynamo.router_queue_policy; AIS cases run the reference from "
                           "setup_aisimulate.sh --with-dynamo (default 0: the cases of earlier runs)")
    what.add_argument("--speculation", type=float, default=0.0, metavar="P",
                      help="with probability P per decoding engine, draw MTP speculation (aic_nextn or an AIS "
                           "config's nextn, per-position accept rates, aic_mtp_seed) on a stream of its own "
                           "(default 0: the cases of earlier runs)")
    how = p.add_argument_group("how")
    how.add_argument("--binary", default=DEFAULT_BINARY)
    how.add_argument("--cache-dir", default=DEFAULT_CACHE)
    how.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as a hang")
    how.add_argument("--tolerance", type=float, default=0.005, help="relative tolerance (default 0.005)")
    how.add_argument("--abs-floor", type=float, default=1e-6,
                     help="absolute differences up to this are float noise (default 1e-6)")
    how.add_argument("--kv-runs", type=int, default=5, help="reference runs of a kv_router case")
    how.add_argument("--kv-confirm", type=int, default=20,
                     help="runs on each side that confirm a kv_router case's range miss before it counts as "
                          "differing (default 20; at most --kv-runs turns confirming off)")
    how.add_argument("--jobs", type=int, default=1, help="cases run in parallel (each runs 1 process at a time)")
    how.add_argument("--pr-tolerance-ms", type=float, default=0.001, help="--per-request: time tolerance")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="OUT", help="write all results as JSON")
    out.add_argument("--minimise", action="store_true",
                     help="minimise every case that differs or fails in one tool only")
    out.add_argument("--minimise-all", action="store_true", help="--minimise fail-both and hang cases too")
    out.add_argument("--outdir", default="/tmp/difffuzz-repros", help="where minimised cases go")
    out.add_argument("--name", help="--minimise-case: the repro's name (default min_<id>)")
    out.add_argument("--minimise-metric", help="the metric a differing case must keep beyond tolerance "
                     "(default: a differing count, else the worst headline metric, else the worst metric)")
    out.add_argument("--minimise-budget", type=int, default=250, help="evaluations per minimised case")
    out.add_argument("--minimise-timeout", type=float, default=30.0,
                     help="reference timeout while minimising (hang cases)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    traces = TraceStore(args.cache_dir)
    if args.dry_run:
        for item in build_items(args, traces):
            print(f"{item['id']:10} {describe(item['case'])}\n           {json.dumps(item['case'])}")
        return 0
    wait_for_binary(args.binary)
    runner = Runner(args, traces)
    if args.per_request:
        return per_request(runner, args.per_request, args)
    if args.minimise_case:
        case = load_case(args.minimise_case)
        item = runner.evaluate(case)
        item.update(id=os.path.basename(args.minimise_case).removesuffix(".json"), case=case)
        log(f"{item['id']}: {item['status']}: {fmt_worst(item)}")
        if args.name is None:
            args.name = "min_" + re.sub(r"[^A-Za-z0-9_]", "_", item["id"])
        return 0 if minimise(runner, traces, item, args) else 1
    items = build_items(args, traces)
    results = run_items(runner, items, args.jobs)
    print_table(results)
    print_totals(results)
    if args.minimise:
        statuses = STATUSES[1:] if args.minimise_all else MINIMISE_STATUSES
        for r in results:
            if r["status"] in statuses:
                r["minimised"] = minimise(runner, traces, r, argparse.Namespace(**{**vars(args), "name": None}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": [json_result(r) for r in results], "totals": tally(results)},
                      f, indent=1)
    return 1 if any(gating_failure(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
