#!/usr/bin/env python3
"""The unified-YAML census: every key of the reference's schema, one key at a time, through both tools.

  scripts/yaml_census.py                          # the whole census; markdown table on stdout
  scripts/yaml_census.py --json /tmp/census.json  # also the full per-case results
  scripts/yaml_census.py --only kv_transfer       # the cases whose key contains a substring
  scripts/yaml_census.py --list                   # the generated cases, nothing run
  scripts/yaml_census.py --no-reference           # reference results from the cache only

Schema. The keys are not listed here: they come from the installed reference. The walk runs
under the aisimulate 0.13 venv's python (--ref-python, default $AISIM_REF_VENV/bin/python, else
/tmp/servesim-aisim-ref/bin/python): this script re-runs itself there with --ref-helper, and
that child imports `aisimulate.config.cli.CorePredictionConfig` / `CoreRecommendationConfig` and
walks every field recursively (unions, Optional, Annotated; `{choices}` / `{range}` wrappers
are recommend domains, not keys). The Dynamo adapter sections come from Dynamo 1.6.1's own
models (--dynamo-site, the site-packages of /tmp/servesim-dynamo-ref): `router:` is
`dynamo.router.simulation.config.Router{Prediction,Recommendation}Config`; `planner:` is the
prediction keys of `dynamo.planner.simulation.provider` (`_PUBLIC_CONFIG_FIELDS`, typed by
`PlannerConfig`) and `PlannerRecommendationConfig`. Importing those needs modules the venv lacks
(sklearn, kubernetes, ...); the helper stubs exactly the missing ones, for the schema only.
A key is a leaf path with the three worker roles folded (`engine.workers.<role>.…`, tried on the
role of its base); a key is in `predict`, `recommend` or both.

Cases. One case per key and value: every `Literal` value the schema allows; the other value of
a bool; otherwise the values in VALUES below (the census of 2026-12's tested values), or a
value derived from the type and default. A key whose block has required fields is set inside a
whole block (BLOCKS), and a few keys bring the companions they need (`load.type: poisson` with
`requests_per_second`, ...). Each case is one of the small BASES plus its override: aggregated
Qwen3-8B on h200_sxm, vLLM, a fixed 4,000-block KV cache, 20 requests of 300/20 tokens at
concurrency 4; fixed timing (20/5 ms) where the key is inert to timing, AIS timing
(`timing.type: default`) for the keys the estimator reads, and disaggregated, SGLang, MoE,
session, trace and recommend (a 1-candidate space, random search) bases where the key needs
them. Recommend-domain cases (`{choices: [a, b]}`) run on the recommend base for every key whose
recommend schema takes a domain. Each base also runs unmodified (case `<base>:base`).

Run. 1) The reference validates every case (`model_validate`; adapter sections through their
models): a case it refuses is a *probe*, reported apart (and flagged when servesim accepts it).
2) servesim runs every case (--binary, default target/release/servesim; `predict -c` or
`recommend -c`, `--threads 1`, recommend with `--no-cache`): exit 0 is accepted, otherwise
refused with its message. 3) The reference runs each valid case (servesim's refusals too, to tell a refusal
both tools share from one only servesim makes)
(../shared/parity/aisimulate_predict.py under --ref-python; `router:` / `planner:` cases need
--stack dynamo, i.e. the venv of `../shared/parity/setup_aisimulate.sh --with-dynamo`,
--dyn-python, and are "unchecked" without it; servesim gets that interpreter as
$SERVESIM_PLANNER_PYTHON for Dynamo's ARIMA / Prophet predictors). Reference results are cached in --cache-dir
(default ~/.cache/servesim-yaml-census) keyed by the sha256 of the case (command, stack, config,
and the content of any trace it names), so a re-run only runs servesim.

Comparison. Predict: every numeric summary metric both tools report (TTFT, ITL, TPOT, E2E,
throughputs, request and token counts, prefix reuse, worker seconds, ...) except the wall-clock
ones must agree within --tolerance (relative, default 0.5 %; absolute below 1e-9; a std_* spread
relative to its metric's mean, since a near-zero spread turns float noise into large ratios). Recommend:
the same candidates (matched by mode, backend, each role's parallel shape and scheduler knobs,
router and planner policy), each status and GPU count equal and its metrics within the tolerance;
where a random search sampled its space (a tool evaluated max_trials candidates) only the
candidates both evaluated are compared. A case that breaks this *differs*.

Classification. A case: probe, refused, both-refuse (servesim refused it and the reference's
run failed too, e.g. a snapshot seed that cuts through an unresolved dependency, or a decode
context parallelism the model's KV heads cannot take), accepted, differs, ref-fails (servesim
ran it, the reference's run failed), partly-refused (recommend: servesim marks candidates `unsupported` that
the reference evaluates), unchecked (no reference result, or two random searches that sampled
no candidate in common). A key, folding its values: differs (any case differs), refused (every
valid case refused, or only the schema's neutral default accepted), accepted (every valid case
accepted or refused by both tools; unchecked cases marked, and a key with both-refuse cases
marked "both refuse some values"), restricted (the rest), untested (only probes). ref-fails
cases are flagged and left out of the key's status. Flags: servesim accepts a probe or a case whose reference run
fails; servesim says "unknown key" for a key the reference documents. The markdown has one
table per section (key, status, values tried, servesim's message for refusals), the totals and
the flags; --json writes every case with its YAML, both outcomes and the metric deviations.
Output is sorted and deterministic (no times; servesim's messages without the run's temporary
path). The reference's KV router breaks ties at random (unseeded): a `kv_router` case's cached
reference result is one draw, so a borderline case may flip on a fresh cache.
"""
import argparse
import concurrent.futures
import copy
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
GEN = os.path.join(ROOT, "tests", "parity", "gen")
ROLES = ("aggregated", "prefill", "decode")
WALL_CLOCK = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s", "call_wall_ms"}
DELETE = object()  # an override value that removes the key


class Replace(dict):
    """An override value that replaces a whole block (a plain dict merges into it)."""

# ---------------------------------------------------------------------------------------------
# Bases

_TRAFFIC = {
    "source": {"type": "synthetic", "input_tokens": 300, "output_tokens": 20},
    "load": {"type": "concurrency", "concurrency": 4},
    "stop": {"requests": 20},
}
_FIXED = {"type": "fixed", "prefill_ms": 20, "decode_ms": 5}
_KV = {"capacity": {"type": "fixed", "blocks": 4000}}


def _agg(timing, backend="vllm", model="Qwen/Qwen3-8B", extra_worker=None):
    worker = {"kv_cache": copy.deepcopy(_KV), "timing": copy.deepcopy(timing)}
    worker.update(extra_worker or {})
    return {
        "traffic": copy.deepcopy(_TRAFFIC),
        "engine": {"mode": "aggregated", "model": model, "hardware": "h200_sxm", "backend": backend,
                   "workers": {"aggregated": worker}},
    }


def _disagg():
    cfg = _agg(_FIXED)
    worker = cfg["engine"]["workers"].pop("aggregated")
    cfg["engine"]["mode"] = "disaggregated"
    cfg["engine"]["workers"] = {"prefill": copy.deepcopy(worker), "decode": copy.deepcopy(worker)}
    return cfg


def _session():
    cfg = _agg(_FIXED)
    cfg["traffic"] = {
        "source": {"type": "synthetic-session", "new_input_tokens_per_turn": 300, "output_tokens_per_turn": 20,
                   "session": {"turns": 2}},
        "load": {"type": "concurrency", "concurrency": 4},
        "stop": {"sessions": 10},
    }
    return cfg


def _trace(fmt="mooncake", path="mooncake.jsonl", **source):
    cfg = _agg(_FIXED)
    cfg["traffic"] = {
        "source": {"type": "trace", "format": fmt, "paths": [os.path.join(GEN, path)], **source},
        "load": {"type": "trace_timestamps"},
    }
    return cfg


def _recommend():
    cfg = _agg(_FIXED, extra_worker={
        "parallelism": {"preset": False, "replicas": 1, "tensor": 1},
        "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
    })
    cfg["evaluation"] = {"sla": {"ttft_ms": 500, "itl_ms": 20}}
    cfg["optimization"] = {"target": "throughput"}
    cfg["optimizer"] = {"algorithm": "random", "max_trials": 4, "parallelism": 1}
    return cfg


def _router():
    cfg = _agg(_FIXED, extra_worker={"parallelism": {"replicas": 2}})
    cfg["traffic"]["source"]["input_tokens"] = 600
    return cfg


def _planner():
    cfg = _router()
    cfg["evaluation"] = {"sla": {"ttft_ms": 500, "itl_ms": 20}}
    cfg["planner"] = {"policy": "enabled"}
    return cfg


def _planner_disagg():
    cfg = _disagg()
    for role in ("prefill", "decode"):
        cfg["engine"]["workers"][role]["parallelism"] = {"tensor": 1}
    cfg["evaluation"] = {"sla": {"ttft_ms": 500, "itl_ms": 20}}
    cfg["planner"] = {"policy": "enabled"}
    return cfg


def _rec_planner():
    cfg = _recommend()
    cfg["planner"] = {"policy": "enabled"}
    return cfg


# A Qwen3-8B-width dense draft stack (5 Qwen3 layers), as the dflash / dspark probes' draft_config.
_BLOCK_DRAFT = {"model_type": "qwen3", "num_hidden_layers": 5, "hidden_size": 4096, "intermediate_size": 12288,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}

BASES = {
    # name: (command, config, what it is for)
    "agg_fixed": ("predict", _agg(_FIXED), "aggregated vLLM Qwen3-8B h200_sxm, fixed timing 20/5 ms"),
    "agg_ais": ("predict", _agg({"type": "default"}), "agg_fixed with AIS timing (timing.type: default)"),
    "moe_ais": ("predict", _agg({"type": "default"}, model="Qwen/Qwen3-30B-A3B"),
                "agg_ais with the MoE Qwen3-30B-A3B"),
    "sglang_ais": ("predict", _agg({"type": "default"}, backend="sglang"), "agg_ais on SGLang"),
    "moe_sglang_ais": ("predict", _agg({"type": "default"}, backend="sglang", model="Qwen/Qwen3-30B-A3B"),
                       "moe_ais on SGLang"),
    "sglang_fixed": ("predict", _agg(_FIXED, backend="sglang"), "agg_fixed on SGLang"),
    # The image / vision / encoder keys are probed on a model with a vision tower.
    "vl_ais": ("predict", _agg({"type": "default"}, model="Qwen/Qwen3-VL-8B-Instruct"),
               "agg_ais with Qwen3-VL-8B-Instruct (vision tower)"),
    "vl_sglang_ais": ("predict", _agg({"type": "default"}, backend="sglang", model="Qwen/Qwen3-VL-8B-Instruct"),
                      "vl_ais on SGLang"),
    "disagg_fixed": ("predict", _disagg(), "disaggregated (1 prefill + 1 decode worker), fixed timing"),
    "session": ("predict", _session(), "agg_fixed with 10 synthetic 2-turn sessions"),
    "trace": ("predict", _trace(), "agg_fixed replaying tests/parity/gen/mooncake.jsonl (300 requests)"),
    "trace_agentic": ("predict", _trace("agentic_mooncake", "agentic_mooncake.jsonl"),
                      "agg_fixed replaying tests/parity/gen/agentic_mooncake.jsonl"),
    "router": ("predict", _router(), "agg_fixed, 2 replicas, 600-token prompts (router: section)"),
    "planner": ("predict", _planner(), "router base with SLA bounds and planner: {policy: enabled}"),
    "planner_disagg": ("predict", _planner_disagg(), "disagg_fixed with SLA bounds and planner: {policy: enabled}"),
    "rec_fixed": ("recommend", _recommend(),
                  "recommend: agg_fixed pinned to 1 candidate (preset false, 1x TP1, SLA 500/20 ms), random search, "
                  "4 trials"),
    "rec_planner": ("recommend", _rec_planner(), "rec_fixed with planner: {policy: enabled}"),
}

# ---------------------------------------------------------------------------------------------
# Values. A key's cases: VALUES[key] when listed, else the schema's literals / the other bool /
# a value from the type. An entry is a value, or V(value, base=..., also={path: value}).


class V:
    def __init__(self, value, base=None, also=None, label=None, command=None):
        self.value, self.base, self.also, self.label, self.command = value, base, also or {}, label, command


SYSTEMS_DIR = "<systems>"  # replaced by the reference's systems directory
TRACE_FILES = {"mooncake": "mooncake.jsonl", "mooncake-delta": "mooncake_delta.jsonl",
               "agentic_mooncake": "agentic_mooncake.jsonl", "applied_compute_agentic": "applied.jsonl",
               "dynamo": "dynamo/shard-000.jsonl", "weka": "weka.jsonl"}
R = "engine.workers.<role>"

_EPD = {"engine.workers.encoder": {"mode": "analytical"}}

VALUES = {
    # traffic
    "traffic.load.agentic_lanes": [V(1, base="trace_agentic")],
    # The census trace's seeded cuts cross unresolved dependencies (both tools refuse them): an
    # exact selection it has.
    "traffic.load.agentic_warmup": [V(True, base="trace_agentic", also={
        "traffic.load.agentic_snapshot": {"seed": 3, "corpus_cursor": 1,
                                          "initial_selections": [{"source_play_id": "play00000", "t_star_ms": 0}]},
        "traffic.load.agentic_lanes": 1})],
    "traffic.load.agentic_warmup_policy": [
        V("repeated_prefixes", base="trace_agentic"),
        V("live_trajectory_v1", base="trace_agentic", also={
            "traffic.load.agentic_snapshot": {"seed": 3}, "traffic.load.agentic_warmup": True,
            "traffic.load.agentic_lanes": 1,
            "traffic.load.agentic_profile": {"duration_seconds": 60.0}})],
    "traffic.load.agentic_snapshot.corpus_cursor": [
        V(1, also={"traffic.load.agentic_snapshot.initial_selections": [{"source_play_id": "play00000", "t_star_ms": 0}]})],
    "traffic.load.agentic_snapshot.initial_selections": [
        V([{"source_play_id": "play00000", "t_star_ms": 0}], label="[play00000@0]",
          also={"traffic.load.agentic_snapshot.corpus_cursor": 1})],
    "traffic.load.concurrency": [8],
    "traffic.load.fraction": [V(0.5, base="rec_fixed", also={"traffic.load": Replace(type="kv_capacity_fraction")})],
    "traffic.load.requests_per_second": [V(5, also={"traffic.load": Replace(type="poisson")})],
    "traffic.load.seed": [V(7, also={"traffic.load": Replace(type="poisson", requests_per_second=5)})],
    "traffic.load.sessions_per_second": [V(2, base="session", also={"traffic.load": Replace(type="poisson")})],
    "traffic.load.speedup": [V(2, base="trace")],
    "traffic.load.type": [V("concurrency"), V("poisson", also={"traffic.load": Replace(requests_per_second=5)}),
                          V("constant_rate", also={"traffic.load": Replace(requests_per_second=5)}),
                          V("trace_timestamps", base="trace"),
                          V("kv_capacity_fraction", base="rec_fixed", also={"traffic.load": Replace(fraction=0.5)})],
    "traffic.source.block_size": [V(1024, base="trace")],
    "traffic.source.cached_prefix_tokens": [128],
    "traffic.source.format": [V(f, base="trace", also={"traffic.source.paths": [os.path.join(GEN, p)], **(
        {"traffic.load": Replace(type="concurrency", concurrency=4)} if f == "applied_compute_agentic" else {})})
                              for f, p in sorted(TRACE_FILES.items())],
    "traffic.source.input_tokens": [600],
    "traffic.source.output_tokens": [40],
    "traffic.source.nested_timestamp_basis": [
        V(b, base="trace", also={"traffic.source.format": "weka",
                                 "traffic.source.paths": [os.path.join(GEN, "weka.jsonl")]})
        for b in ("auto", "absolute", "relative")],
    "traffic.source.new_input_tokens_per_turn": [V(200, base="session")],
    "traffic.source.output_tokens_per_turn": [V(10, base="session")],
    "traffic.source.paths": [V([os.path.join(GEN, "mooncake.jsonl")], base="trace", label="[mooncake.jsonl]")],
    "traffic.source.session.inter_turn_delay_ms": [V(50, base="session")],
    "traffic.source.session.prefix_groups": [V(2, base="session")],
    "traffic.source.session.shared_prefix_ratio": [V(0.5, base="session",
                                                     also={"traffic.source.session.prefix_groups": 2})],
    "traffic.source.session.turns": [V(3, base="session")],
    "traffic.source.type": [V("synthetic"), V("synthetic-session", base="session"), V("trace", base="trace")],
    "traffic.stop.max_virtual_time_seconds": [V(1.0, base="trace")],
    "traffic.stop.requests": [30],
    "traffic.stop.requests_per_load_unit": [V(3, also={"traffic.stop.requests": DELETE})],
    "traffic.stop.sessions": [V(8, base="session")],
    "traffic.stop.sessions_per_load_unit": [V(2, base="session", also={"traffic.stop.sessions": DELETE})],
    # Each on the native VL path (no pool) and through an analytical encoder pool (EPD).
    "traffic.source.images.count": [2, V(2, also=_EPD)],
    "traffic.source.images.encoding": ["png", "jpeg", V("jpeg", also=_EPD)],
    "traffic.source.images.identity": ["unique", {"pool": 4}, V("unique", also=_EPD), V({"pool": 4}, also=_EPD)],
    "traffic.source.images.identity.pool": [4, V(4, also=_EPD)],
    "traffic.source.images.max_pixels": [500000, V(500000, also=_EPD)],
    "traffic.source.images.min_pixels": [1000, V(1000, also=_EPD)],
    "traffic.source.images.height": [448, V(448, also=_EPD)],
    "traffic.source.images.width": [448, V(448, also=_EPD)],
    # engine (top level)
    "engine.attention_backend": ["flashinfer"],
    "engine.backend": ["vllm", "sglang", "trtllm"],
    "engine.backend_version": ["0.24.0", "previous"],
    "engine.comm_quant_mode": ["half"],
    "engine.context_length": [4096, "max"],
    "engine.decoder_replay": [V(True, also={"engine.model": "deepseek-ai/DeepSeek-V4.1-Flash",
                                            "engine.backend": "sglang"})],
    "engine.enable_chunked_prefill": [False, True],
    "engine.enable_eplb": [V(True, base="moe_ais"), V(False, base="moe_ais")],
    "engine.enable_shared_layer": [False, True],
    "engine.estimator_config": [{}, {"correction": {"enabled": False}}],
    "engine.fmha_quant_mode": ["fp8"],
    "engine.gemm_quant_mode": ["fp8"],
    "engine.hardware": ["h100_sxm"],
    "engine.kvcache_quant_mode": ["fp8"],
    "engine.mode": [V("aggregated", base="agg_fixed"), V("disaggregated", base="disagg_fixed"),
                    V("afd", base="moe_ais", also={"engine.afd": {
                        "phase": "both", "combined_with_pd": False, "n_a_nodes": 2, "n_f_nodes": 2, "tp_a": 1,
                        "a_batch_size": 16}, "engine.workers": Replace()})],
    "engine.model": ["Qwen/Qwen3-32B"],
    "engine.moe_backend": [V("deepep", base="moe_ais"), V("default", base="moe_ais"),
                           V("deepep_moe", base="moe_ais"), V("deepep_moe", base="moe_sglang_ais"),
                           V("megamoe", base="moe_sglang_ais")],
    "engine.moe_kernel_source": [V("triton", base="moe_ais")],
    "engine.moe_quant_mode": [V("fp8", base="moe_ais")],
    "engine.nextn": [V(1, also={"engine.nextn_accepted": 0.8})],
    "engine.nextn_accepted": [V(0.8, also={"engine.nextn": 1})],
    "engine.strict_provenance": [True],
    "engine.systems_path": [SYSTEMS_DIR],
    "engine.systems_paths": [["default"]],
    "engine.transfer_policy": [["xshape"], ["xshape", "xquant", "xprofile", "xop"]],
    "engine.wideep_num_slots": [V(288, base="moe_ais")],
    "engine.kv_transfer.bandwidth_gb_per_second": [50],
    "engine.kv_transfer.bytes_per_token": [147456, "auto"],
    "engine.tokenization.base_ms": [1.0],
    "engine.tokenization.per_input_token_us": [2.0],
    "engine.tokenization.workers": [2],
    "engine.speculation.kind": ["ngram"] + [
        V(k, also={"engine.speculation": Replace(expected_accepted_tokens=0.8, **extra)})
        for k, extra in (("mtp", {"params": {"depth": 1}}), ("eagle3", {}),
                         ("draft_model", {"draft_model_path": "Qwen/Qwen3-0.6B",
                                          "params": {"num_speculative_tokens": 2}}),
                         ("dflash", {"params": {"num_draft_tokens": 3}, "draft_config": _BLOCK_DRAFT | {
                             "block_size": 16, "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}}}),
                         ("dspark", {"params": {"num_draft_tokens": 3}, "draft_config": _BLOCK_DRAFT | {
                             "block_size": 7, "target_layer_ids": [1, 9, 17, 25, 33]}}))],
    "engine.speculation.num_speculative_tokens": [V(2, also={"engine.speculation.acceptance_rates": [0.7, 0.5]})],
    "engine.speculation.acceptance_rates": [[0.7]],
    "engine.speculation.seed": [7],
    "engine.speculation.expected_accepted_tokens": [
        V(0.8, also={"engine.speculation": Replace(kind="mtp", params={"depth": 1})})],
    "engine.speculation.params": [V({"depth": 2},
                                    also={"engine.speculation": Replace(kind="mtp", expected_accepted_tokens=0.8)})],
    "engine.speculation.draft_model_path": [V("Qwen/Qwen3-0.6B", also={"engine.speculation": Replace(
        kind="draft_model", expected_accepted_tokens=0.8, params={"num_speculative_tokens": 2})})],
    "engine.speculation.draft_config": [V({}, also={"engine.speculation": Replace(
        kind="draft_model", expected_accepted_tokens=0.8, draft_model_path="Qwen/Qwen3-0.6B",
        params={"num_speculative_tokens": 2})})],
    # workers
    f"{R}.context_length": [4096],
    f"{R}.hardware": [V("h100_sxm", base="disagg_fixed", label="decode h100_sxm")],
    f"{R}.host_loop": [V(True, base="sglang_ais")],
    f"{R}.startup_seconds": [5],
    f"{R}.kv_cache.block_size": [32],
    f"{R}.kv_cache.bytes_per_token": [147456],
    f"{R}.kv_cache.capacity.blocks": [60],
    f"{R}.kv_cache.capacity.bytes": [V(int(2e8), also={f"{R}.kv_cache.capacity": Replace(type="fixed"),
                                                       f"{R}.kv_cache.block_size": 16,
                                                       f"{R}.kv_cache.bytes_per_token": 147456})],
    f"{R}.kv_cache.capacity.cuda_graph_reserved_bytes": [
        V(int(1e9), base="agg_ais", also={f"{R}.kv_cache.capacity": Replace(type="default")})],
    f"{R}.kv_cache.capacity.memory_fraction": [
        V(0.8, base="agg_ais", also={f"{R}.kv_cache.capacity": Replace(type="default")})],
    f"{R}.kv_cache.capacity.type": [V("default", also={f"{R}.kv_cache.capacity.blocks": DELETE}), "fixed"],
    f"{R}.kv_cache.prefix_caching": [False],
    f"{R}.kv_cache.prefix_match_unit": [V(16, also={f"{R}.kv_cache.state_cache": {"bytes_per_request": 10000000},
                                                    f"{R}.kv_cache.block_size": 16,
                                                    f"{R}.kv_cache.bytes_per_token": 147456})],
    f"{R}.kv_cache.host_offload.num_host_blocks": [2000],
    f"{R}.kv_cache.g3_offload.num_g3_blocks": [4000],
    f"{R}.kv_cache.state_cache.bytes_per_request": [V(10000000, also={f"{R}.kv_cache.block_size": 16,
                                                                      f"{R}.kv_cache.bytes_per_token": 147456})],
    f"{R}.parallelism.attention_data": [2],
    f"{R}.parallelism.decode_context": [V(2, also={f"{R}.parallelism.tensor": 2})],
    f"{R}.parallelism.moe_expert": [V(2, base="moe_ais", also={f"{R}.parallelism.tensor": 2})],
    f"{R}.parallelism.moe_tensor": [V(2, base="moe_ais", also={f"{R}.parallelism.tensor": 2})],
    f"{R}.parallelism.pipeline": [2],
    f"{R}.parallelism.prefill_context": [V(2, base="sglang_ais"), V(1, base="sglang_ais")],
    f"{R}.parallelism.replicas": [2],
    f"{R}.parallelism.tensor": [2],
    f"{R}.parallelism.preset": [V("default", base="rec_fixed", also={f"{R}.parallelism.replicas": DELETE,
                                                                      f"{R}.parallelism.tensor": DELETE}),
                                V(False, base="rec_fixed"),
                                V([{"tensor": 1, "attention_data": 1, "moe_expert": 1, "moe_tensor": 1, "pipeline": 1,
                                    "replicas": 1}], base="rec_fixed", label="[{1x TP1}]",
                                  also={f"{R}.parallelism.replicas": DELETE, f"{R}.parallelism.tensor": DELETE})],
    f"{R}.scheduler.max_batched_tokens": [256],
    f"{R}.scheduler.max_sequences": [2],
    f"{R}.scheduler.prefill_decode_interval": [V(2, base="sglang_fixed")],
    f"{R}.scheduler.prefill_schedule_interval": [2],
    f"{R}.timing.decode_ms": [V(7, base="agg_fixed")],
    f"{R}.timing.prefill_ms": [V(30, base="agg_fixed")],
    f"{R}.timing.type": [V("default", base="agg_ais"), V("fixed", base="agg_fixed"),
                         V("polynomial", base="agg_fixed", also={f"{R}.timing.prefill_ms": DELETE,
                                                                  f"{R}.timing.decode_ms": DELETE})],
    f"{R}.timing.attention_backend": ["flashinfer"],
    f"{R}.timing.comm_quant_mode": ["half"],
    f"{R}.timing.fmha_quant_mode": ["fp8"],
    f"{R}.timing.gemm_quant_mode": ["fp8"],
    f"{R}.timing.kvcache_quant_mode": ["fp8"],
    f"{R}.timing.moe_quant_mode": [V("fp8", base="moe_ais")],
    f"{R}.timing.estimator_config": [{"correction": {"enabled": False}}],
    f"{R}.timing.fpm_parquet_path": [V("x.parquet", also={f"{R}.timing.forward_model": "fpm"})],
    f"{R}.timing.systems_paths": [["default"]],
    f"{R}.timing.transfer_policy": [["xshape"]],
    f"{R}.vision.cache_mib": [200],
    f"{R}.frontend.stages": [[{"service_ms": 2.0}]],
    f"{R}.frontend.measured_for.model": ["Qwen/Qwen3-VL-8B-Instruct"],
    f"{R}.frontend.measured_for.height": [448],
    f"{R}.frontend.measured_for.width": [448],
    f"{R}.host_profile.path": ["host.yaml"],
    # evaluation / execution
    "evaluation.sla.e2e_ms": [2000],
    "evaluation.sla.itl_ms": [20.0],
    "evaluation.sla.ttft_ms": [500.0],
    "execution.resources.available_memory_fraction": [0.8],
    "execution.resources.cpu_limit": [2, "auto"],
    "execution.resources.initialization_timeout_seconds": [30.0],
    "execution.resources.memory_limit_gb": [8.0, "auto"],
    "execution.resources.reserve_memory_fraction": [0.1],
    "execution.resources.reserve_memory_gb": [0.5],
    "execution.resources.shutdown_timeout_seconds": [2.0],
    # optimization / optimizer
    "optimization.constraints.max_candidate_gpus": [4],
    "optimization.constraints.min_candidate_gpus": [1],
    "optimization.constraints.min_goodput_rps": [V(1, also={"optimization.target": "min_gpus",
                                                            "traffic.load": Replace(type="poisson",
                                                                                    requests_per_second=5)})],
    "optimization.hardware": [V("h200_sxm", also={"engine.hardware": "auto"})],
    "optimization.strict_sla": [True],
    "engine.workers.encoder.rate_degradation": [0.8],
    "engine.workers.encoder.frontend.stages": [V([{"service_ms": 2.0}], also={
        "engine.workers.encoder.frontend.measured_for": {"model": "Qwen/Qwen3-VL-8B-Instruct", "frontend": "python",
                                                         "feature_transport": "inline", "height": 448, "width": 448}})],
    "engine.workers.encoder.mode": ["analytical", V("native", also={
        "engine.backend": "sglang", "engine.workers.encoder.transfer": {"bandwidth_gb_per_second": 25.0},
        "engine.workers.encoder.host_profile": {"frontend": "python", "path": "host.yaml"}})],
    # planner
    "planner.fpm_sample_bucket_size": [64],
    "planner.load_scaling_down_sensitivity": [50],
    "planner.prefill_min_workers": [V(2, base="planner_disagg")],
    "planner.decode_min_workers": [V(2, base="planner_disagg")],
    "planner.scaling_policy.preset": ["default", False, V(["throughput_180_5", "load_180_5"],
                                                          label="[throughput_180_5, load_180_5]")],
    "planner.fpm_sampling.preset": ["default", False, V(["small", "large"], label="[small, large]")],
    "planner.load_sensitivity.preset": ["default", False, V(["aggressive"], label="[aggressive]")],
    "planner.load_predictor.preset": ["default", False, V(["constant_last", "kalman_default_raw"],
                                                          label="[constant_last, kalman_default_raw]"),
                                      V(["arima_raw"], label="[arima_raw]")],
    "planner.load_predictor.type": [V(t, also={"planner.load_predictor.preset": False})
                                    for t in ("constant", "kalman", "arima", "prophet")],
    "optimizer.candidate_timeout_seconds": [60.0],
    "optimizer.max_trials": [3],
    "optimizer.parallelism": [2],
    "optimizer.seed": [7],
    # router
    "router.overlap_score_credit": [V(0.5, also={"router.policy": "kv_router"})],
    "router.prefill_load_scale": [V(2.0, also={"router.policy": "kv_router"})],
    "router.temperature": [V(0.5, also={"router.policy": "kv_router"})],
    "router.prefill_load_model.type": [V("none", also={"router.policy": "kv_router"}),
                                       V("ais", base="router", also={"router.policy": "kv_router"})],
}

# A key under one of these blocks is set inside the whole block (its required fields filled).
BLOCKS = {
    "traffic.source.images": {"height": 448, "width": 448},
    "traffic.load.agentic_snapshot": {"seed": 3},
    "traffic.load.agentic_profile": {"duration_seconds": 60.0},
    "traffic.load.agentic_snapshot.initial_selections": None,
    "engine.fpm_profile": {"schema_version": 1, "model": "Qwen/Qwen3-8B",
                           "model_revision": "0123456789abcdef0123456789abcdef01234567",
                           "architecture": "Qwen3ForCausalLM", "context_length": 40960, "num_experts": 0,
                           "provenance": "census", "deployments": [{
                               "system": "h200_sxm", "backend": "vllm", "backend_version": "0.24.0", "tp": 1, "dp": 1,
                               "moe_tp": 1, "moe_ep": 1, "gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16",
                               "fmha_quant_mode": "bfloat16", "comm_quant_mode": "half", "kv_cache_dtype": "bfloat16",
                               "resources": {"cache_layout": "linear", "kv_bytes_per_token": 147456,
                                             "max_num_tokens": 8192, "max_batch_size": 256,
                                             "weights_bytes": 16400000000, "activations_bytes": 1000000000,
                                             "runtime_overhead_bytes": 500000000, "comm_overhead_bytes": 0,
                                             "provenance": "census"}}]},
    "engine.afd": {"phase": "both", "combined_with_pd": False, "n_a_nodes": 2, "n_f_nodes": 2, "tp_a": 1,
                   "a_batch_size": 16},
    "engine.speculation": {"kind": "ngram", "num_speculative_tokens": 1, "acceptance_rates": [0.7]},
    "engine.tokenization": {},
    "engine.kv_transfer": {},
    f"{R}.kv_cache.host_offload": {"num_host_blocks": 2000},
    f"{R}.kv_cache.g3_offload": {"num_g3_blocks": 4000, "scope": "worker_local"},
    f"{R}.kv_cache.kvcr": {},
    f"{R}.kv_cache.state_cache": {},
    f"{R}.frontend": {"stages": [{"service_ms": 2.0}]},
    f"{R}.frontend.measured_for": {"model": "Qwen/Qwen3-VL-8B-Instruct", "frontend": "rust", "feature_transport": "inline",
                                   "height": 448, "width": 448},
    f"{R}.host_profile": {"frontend": "rust", "path": "host.yaml"},
    f"{R}.vision": {},
    "engine.workers.encoder": {"mode": "analytical"},
    "engine.workers.encoder.frontend": {"stages": [{"service_ms": 2.0}]},
    "engine.workers.encoder.frontend.measured_for": {"model": "Qwen/Qwen3-VL-8B-Instruct", "frontend": "python",
                                                     "feature_transport": "inline", "height": 448, "width": 448},
    "engine.workers.encoder.host_profile": {"frontend": "python", "path": "host.yaml"},
    "engine.workers.encoder.transfer": {"bandwidth_gb_per_second": 25.0},
}
# The recommend form of a block, where it differs.
BLOCKS_RECOMMEND = {"engine.afd": {"phase": "both", "combined_with_pd": False, "a_batch_size": 16}}
# Blocks that bring companions elsewhere in the config.
BLOCK_ALSO = {
    "traffic.source.images": {"engine.backend": "sglang"},
    "engine.workers.encoder": {"traffic.source.images": {"height": 448, "width": 448}},
    "engine.afd": {"engine.mode": "afd", "engine.workers": Replace()},
    "traffic.load.agentic_profile": {"traffic.load.agentic_snapshot": {"seed": 3}, "traffic.load.agentic_lanes": 1},
    "traffic.load.agentic_snapshot": {"traffic.load.agentic_lanes": 1},
    f"{R}.kv_cache.g3_offload": {f"{R}.kv_cache.host_offload": {"num_host_blocks": 2000}},
    f"{R}.kv_cache.kvcr": {f"{R}.kv_cache.host_offload": {"num_host_blocks": 2000}},
    f"{R}.vision": {"traffic.source.images": {"height": 448, "width": 448}, "engine.backend": "sglang"},
    f"{R}.frontend.measured_for": {f"{R}.frontend.stages": [{"service_ms": 2.0}],
                                   "traffic.source.images": {"height": 448, "width": 448}},
    f"{R}.frontend": {"traffic.source.images": {"height": 448, "width": 448}},
    f"{R}.host_profile": {"traffic.source.images": {"height": 448, "width": 448}},
    "engine.workers.encoder.frontend": {"engine.workers.encoder.mode": "native", "engine.backend": "sglang",
                                        "engine.workers.encoder.transfer": {"bandwidth_gb_per_second": 25.0},
                                        "traffic.source.images": {"height": 448, "width": 448}},
    "engine.workers.encoder.frontend.measured_for": {
        "engine.workers.encoder.mode": "native", "engine.backend": "sglang",
        "engine.workers.encoder.frontend.stages": [{"service_ms": 2.0}],
        "engine.workers.encoder.transfer": {"bandwidth_gb_per_second": 25.0},
        "traffic.source.images": {"height": 448, "width": 448}},
    "engine.workers.encoder.host_profile": {"engine.workers.encoder.mode": "native", "engine.backend": "sglang",
                                            "engine.workers.encoder.transfer": {"bandwidth_gb_per_second": 25.0},
                                            "traffic.source.images": {"height": 448, "width": 448}},
    "engine.workers.encoder.transfer": {"engine.workers.encoder.mode": "native", "engine.backend": "sglang",
                                        "engine.workers.encoder.host_profile": {"frontend": "python",
                                                                                "path": "host.yaml"},
                                        "traffic.source.images": {"height": 448, "width": 448}},
}
# Recommend domains whose pair is not derived from the values above.
DOMAINS = {
    "planner.fpm_sample_bucket_size": [16, 64],
    f"{R}.kv_cache.capacity.memory_fraction": [0.8, 0.9],
    "traffic.load.fraction": [0.5, 0.8],
    "planner.load_scaling_down_sensitivity": [50, 80],
}
# Knobs of a Planner preset group: a recommend domain on one needs the group's preset off.
PLANNER_GROUPS = {
    "scaling_policy": ("enable_throughput_scaling", "enable_load_scaling", "throughput_adjustment_interval_seconds",
                       "load_adjustment_interval_seconds"),
    "fpm_sampling": ("max_num_fpm_samples", "fpm_sample_bucket_size"),
    "load_sensitivity": ("load_scaling_down_sensitivity", "load_min_observations"),
    "load_predictor": ("load_predictor_log1p", "prophet_window_size", "kalman_q_level", "kalman_q_trend", "kalman_r",
                       "kalman_min_points"),
}
# The base of a key (first matching prefix wins; the longest prefix is tried first).
KEY_BASES = {
    "traffic.load.agentic_snapshot": "trace_agentic",
    "traffic.load.agentic_profile": "trace_agentic",
    "planner.scaling_policy": "rec_planner",
    "planner.fpm_sampling": "rec_planner",
    "planner.load_sensitivity": "rec_planner",
    "planner.load_predictor": "rec_planner",
    "traffic.source.images": "vl_sglang_ais",
    "engine.kv_transfer": "disagg_fixed",
    "engine.afd": "moe_ais",
    "engine.speculation": "agg_ais",
    "engine.tokenization": "agg_fixed",
    "engine.workers.encoder": "vl_ais",
    "engine": "agg_ais",
    f"{R}.timing": "agg_ais",
    f"{R}.vision": "vl_sglang_ais",
    f"{R}.frontend": "vl_sglang_ais",
    f"{R}.host_profile": "vl_sglang_ais",
    f"{R}.kv_cache": "agg_fixed",
    f"{R}.parallelism": "agg_ais",
    f"{R}.scheduler": "agg_ais",
    f"{R}.context_length": "agg_ais",
    f"{R}": "agg_fixed",
    "traffic": "agg_fixed",
    "evaluation": "agg_fixed",
    "execution": "agg_fixed",
    "optimization": "rec_fixed",
    "optimizer": "rec_fixed",
    "router": "router",
    "planner": "planner",
}


def fold(path):
    parts = path.split(".")
    if len(parts) > 2 and parts[:2] == ["engine", "workers"] and parts[2] in ROLES:
        parts[2] = "<role>"
    return ".".join(parts)


def role_of(base_cfg):
    workers = base_cfg.get("engine", {}).get("workers", {})
    return "aggregated" if "aggregated" in workers else "decode"


# ---------------------------------------------------------------------------------------------
# Reference helper (runs under the reference venv's python)

STUBBED = ("sklearn", "kubernetes", "prometheus_api_client", "pmdarima", "filterpy", "prophet", "statsmodels",
           "msgspec", "zmq", "uvloop", "prometheus_client", "aiohttp")


def _helper_imports(dynamo_site):
    """Import the reference models; stub the packages the schema walk never executes."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    if dynamo_site:
        sys.path.append(dynamo_site)
    missing = {m for m in STUBBED if importlib.util.find_spec(m) is None}

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Stub(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    sys.meta_path.append(_Finder())
    from aisimulate.config import cli  # noqa: F401
    models = {"core": cli}
    try:
        from dynamo.router.simulation import config as router
        from dynamo.planner.simulation import config as planner_config
        from dynamo.planner.simulation import provider as planner_provider
        from dynamo.planner.config.planner_config import PlannerConfig
        models.update(router=router, planner_config=planner_config, planner_provider=planner_provider,
                      PlannerConfig=PlannerConfig)
    except Exception as exc:  # the adapters are optional
        models["adapter_error"] = f"{type(exc).__name__}: {exc}"
    return models


def _helper_walk(models):
    import typing
    import types as pytypes
    from pydantic import BaseModel
    from aisimulate.config.common import IntegerRange, NumericRange

    none = type(None)

    def members(ann):
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            return members(typing.get_args(ann)[0])
        if origin in (typing.Union, pytypes.UnionType):
            return [m for a in typing.get_args(ann) for m in members(a)]
        return [ann]

    def jsonable(v):
        try:
            json.dumps(v)
            return v
        except TypeError:
            return None

    out = {}

    def note(path, section, command, kinds, literals, domain, required, default):
        rec = out.setdefault(path, {"path": path, "section": section, "commands": [], "kinds": [],
                                    "literals": [], "domain": {}, "required": {}, "default": {}, "container": False})
        if command not in rec["commands"]:
            rec["commands"].append(command)
        for k in kinds:
            if k not in rec["kinds"]:
                rec["kinds"].append(k)
        for lit in literals:
            if lit not in rec["literals"]:
                rec["literals"].append(lit)
        rec["domain"][command] = rec["domain"].get(command, False) or domain
        rec["required"][command] = required
        rec["default"][command] = default
        return rec

    def classify(annotation, models_nest=True):
        """(kinds, literals, nested models, whether a {choices}/{range} domain is allowed) of a
        field's annotation. Without models_nest a model member is only named, as a kind."""
        kinds, literals, subs, domain = [], [], [], False
        for m in members(annotation):
            origin = typing.get_origin(m)
            if m is none:
                kinds.append("null")
            elif origin is typing.Literal:
                literals += list(typing.get_args(m))
                kinds.append("literal")
            elif models_nest and isinstance(m, type) and issubclass(m, BaseModel):
                if m.__name__.startswith("Choices") or m in (NumericRange, IntegerRange):
                    domain = True
                else:
                    subs.append(m)
            elif models_nest and origin is list:
                kinds.append("list")
            elif models_nest and origin is dict:
                kinds.append("dict")
            elif m in (bool, int, float, str):
                kinds.append(m.__name__)
            else:
                kinds.append(getattr(m, "__name__", repr(m)))
        return kinds, literals, subs, domain

    def walk(model, prefix, section, command, seen):
        for name, field in model.model_fields.items():
            path = prefix + name
            kinds, literals, subs, domain = classify(field.annotation)
            default = None if field.is_required() else jsonable(field.get_default(call_default_factory=False))
            rec = note(path, section, command, kinds, literals, domain, field.is_required(), default)
            if subs:
                rec["container"] = True
            for sub in subs:
                if (sub, path) not in seen:
                    seen.add((sub, path))
                    walk(sub, path + ".", section, command, seen)

    cli = models["core"]
    walk(cli.CorePredictionConfig, "", "core", "predict", set())
    walk(cli.CoreRecommendationConfig, "", "core", "recommend", set())
    if "router" in models:
        walk(models["router"].RouterPredictionConfig, "router.", "router", "predict", set())
        walk(models["router"].RouterRecommendationConfig, "router.", "router", "recommend", set())
        provider, planner_cfg = models["planner_provider"], models["PlannerConfig"]
        # Predict: the public fields the provider maps onto PlannerConfig, typed by PlannerConfig.
        fields = {"policy": None, **provider._PUBLIC_CONFIG_FIELDS}
        for public, runtime in sorted(fields.items()):
            if runtime is None:
                note("planner.policy", "planner", "predict", ["literal"], ["disabled", "enabled"], False, False,
                     "disabled")
                continue
            field = planner_cfg.model_fields[runtime]
            kinds, literals, _, _ = classify(field.annotation, models_nest=False)
            default = None if field.is_required() else jsonable(field.get_default(call_default_factory=True))
            note("planner." + public, "planner", "predict", kinds, literals, False, False, default)
        walk(models["planner_config"].PlannerRecommendationConfig, "planner.", "planner", "recommend", set())
    return {"keys": [out[p] for p in sorted(out)], "adapter_error": models.get("adapter_error")}


def _helper_validate(models, cases):
    import types as pytypes

    cli = models["core"]
    results = {}
    for case in cases:
        cfg, command = case["config"], case["command"]
        try:
            core = {k: v for k, v in cfg.items() if k in ("traffic", "engine", "evaluation", "execution",
                                                          "optimization", "optimizer")}
            model = cli.CorePredictionConfig if command == "predict" else cli.CoreRecommendationConfig
            if command == "predict" and ({"optimization", "optimizer"} & set(cfg)):
                raise ValueError("predict does not accept optimization/optimizer")
            model.model_validate(core)
            for section in sorted(set(cfg) - set(core)):
                if section == "router" and "router" in models:
                    rm = models["router"]
                    (rm.RouterPredictionConfig if command == "predict" else rm.RouterRecommendationConfig
                     ).model_validate(cfg[section])
                elif section == "planner" and "router" in models:
                    if command == "predict":
                        ctx = pytypes.SimpleNamespace(engine=cfg.get("engine", {}),
                                                      evaluation=cfg.get("evaluation", {}))
                        models["planner_provider"].DynamoPlannerSweepConfigProvider().compile_prediction(
                            cfg[section], ctx)
                    else:
                        models["planner_config"].PlannerRecommendationConfig.model_validate(cfg[section])
                else:
                    raise ValueError(f"no adapter for section {section!r}")
            results[case["id"]] = None
        except Exception as exc:
            results[case["id"]] = " ".join(str(exc).split())[:400]
    return results


def ref_helper():
    request = json.load(sys.stdin)
    models = _helper_imports(request.get("dynamo_site"))
    if request["op"] == "walk":
        out = _helper_walk(models)
    else:
        out = _helper_validate(models, request["cases"])
    json.dump(out, sys.stdout)


def call_helper(ref_python, request):
    proc = subprocess.run([ref_python, os.path.abspath(__file__), "--ref-helper"], input=json.dumps(request),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"yaml_census: the reference helper failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


# ---------------------------------------------------------------------------------------------
# Case generation


def set_path(cfg, path, value):
    parts = path.split(".")
    node = cfg
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if value is DELETE:
        node.pop(parts[-1], None)
    elif isinstance(value, dict) and not isinstance(value, Replace) and isinstance(node.get(parts[-1]), dict):
        merged = node[parts[-1]]
        for k, v in value.items():
            if v is DELETE:
                merged.pop(k, None)
            else:
                merged[k] = copy.deepcopy(v)
    else:
        node[parts[-1]] = copy.deepcopy(dict(value) if isinstance(value, Replace) else value)


def default_values(rec, command):
    """Values for a key the VALUES table does not list, from its type and default."""
    default = rec["default"].get(command)
    kinds = set(rec["kinds"]) - {"null", "literal"}
    if rec["literals"]:
        vals = list(rec["literals"])
        if "int" in kinds:
            vals.append(2)
        return vals
    if "bool" in kinds:
        return [not default] if isinstance(default, bool) else [True, False]
    if "int" in kinds:
        return [default * 2 if isinstance(default, int) and not isinstance(default, bool) and default > 0 else 2]
    if "float" in kinds:
        name = rec["path"].rsplit(".", 1)[-1]
        if isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0:
            return [default / 2 if ("fraction" in name or "ratio" in name or default >= 1) else default * 2]
        return [0.5]
    if "str" in kinds:
        return ["x"]
    if "list" in kinds:
        return [[]]
    if "dict" in kinds:
        return [{}]
    return []


def label_of(value):
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def domain_pair(values, default):
    """Two distinct scalar values for a `{choices: [...]}` domain."""
    scalars = [v.value if isinstance(v, V) else v for v in values]
    scalars = [s for s in scalars if isinstance(s, (int, float, str)) and not isinstance(s, bool)]
    pair = []
    for s in ([default] if isinstance(default, (int, float, str)) and not isinstance(default, bool) else []) + scalars:
        if s not in pair and s is not None:
            pair.append(s)
    if len(pair) == 1 and isinstance(pair[0], (int, float)):
        pair.append(pair[0] * 2)
    return pair[:2] if len(pair) >= 2 else None


def make_cases(keys, systems_dir):
    cases = []
    by_key = {}
    for rec in keys:
        if rec["container"] and not (set(rec["kinds"]) - {"null"}):
            continue  # a block, not a key
        key = fold(rec["path"])
        if key in by_key:
            for c in rec["commands"]:
                if c not in by_key[key]["commands"]:
                    by_key[key]["commands"].append(c)
            dom = by_key[key]["domain"]
            dom.update({c: d or dom.get(c, False) for c, d in rec["domain"].items()})
            continue
        if key.startswith("engine.workers.<role>") and not rec["path"].startswith("engine.workers.aggregated"):
            continue  # the aggregated role stands for all three (prefill/decode differ only in presence)
        by_key[key] = dict(rec, key=key, commands=list(rec["commands"]), domain=dict(rec["domain"]))
    for key in sorted(by_key):
        rec = by_key[key]
        commands = rec["commands"]
        command = "predict" if "predict" in commands else "recommend"
        values = VALUES.get(key) or default_values(rec, command)
        block = max((b for b in BLOCKS if key.startswith(b + ".")), key=len, default=None)
        base_name = next((KEY_BASES[p] for p in sorted(KEY_BASES, key=len, reverse=True)
                          if (key == p or key.startswith(p + ".")) and BASES[KEY_BASES[p]][0] == command),
                         "planner" if key.startswith("planner.") else "agg_fixed")
        if command == "recommend" and BASES[base_name][0] != "recommend":
            base_name = "rec_fixed"
        for v in values:
            v = v if isinstance(v, V) else V(v)
            value = v.value
            if value == SYSTEMS_DIR:
                value = systems_dir
            bname = v.base or base_name
            if bname == "rec_fixed" and "recommend" not in commands and not key.startswith(("traffic", "engine")):
                continue
            base_cmd, base_cfg, _ = BASES[bname]
            cfg = copy.deepcopy(base_cfg)
            role = role_of(cfg)
            rpath = key.replace("<role>", role)
            if block:
                bpath = block.replace("<role>", role)
                tmpl = BLOCKS_RECOMMEND.get(block, BLOCKS[block]) if base_cmd == "recommend" else BLOCKS[block]
                if tmpl is not None:
                    set_path(cfg, bpath, tmpl)
                for p, val in BLOCK_ALSO.get(block, {}).items():
                    set_path(cfg, p.replace("<role>", role), val)
            for p, val in v.also.items():
                set_path(cfg, p.replace("<role>", role), val)
            set_path(cfg, rpath, value)
            label = v.label or label_of(v.value if v.value != SYSTEMS_DIR else "<aisimulate_core/systems>")
            if v.also:
                label += " (+" + ", ".join(f"{p.rsplit('.', 1)[-1]}" for p in v.also) + ")"
            neutral = v.value == rec["default"].get(command) and not v.also
            cases.append({"id": f"{key}={label}", "key": key, "section": rec["section"], "label": label,
                          "base": bname, "command": base_cmd, "config": cfg, "override": {rpath: value, **{
                              p.replace("<role>", role): ("<removed>" if val is DELETE else val)
                              for p, val in v.also.items()}},
                          "neutral": neutral})
        # A recommend domain: {choices: [a, b]} on the recommend base.
        if rec["domain"].get("recommend") and not key.startswith("engine.workers.encoder"):
            pair = DOMAINS.get(key) or domain_pair(values, rec["default"].get("recommend"))
            if pair:
                cfg = copy.deepcopy(BASES["rec_planner" if key.startswith("planner.") else "rec_fixed"][1])
                for group, knobs in PLANNER_GROUPS.items():
                    if key.rsplit(".", 1)[-1] in knobs or key == f"planner.{group}.type":
                        set_path(cfg, f"planner.{group}.preset", False)
                rpath = key.replace("<role>", "aggregated")
                if key.startswith("traffic.load."):
                    name = key.rsplit(".", 1)[-1]
                    load = {"concurrency": {"type": "concurrency"}, "requests_per_second": {"type": "poisson"},
                            "fraction": {"type": "kv_capacity_fraction"}}.get(name)
                    if name == "speedup":
                        cfg["traffic"] = copy.deepcopy(BASES["trace"][1]["traffic"])
                    if name == "sessions_per_second":
                        cfg["traffic"] = copy.deepcopy(BASES["session"][1]["traffic"])
                        load = {"type": "poisson"}
                    if load:
                        cfg["traffic"]["load"] = load
                if key.endswith(".parallelism.moe_expert") or key.endswith(".parallelism.moe_tensor"):
                    set_path(cfg, "engine.model", "Qwen/Qwen3-30B-A3B")
                    set_path(cfg, "engine.workers.aggregated.timing", Replace(type="default"))
                if key.endswith(".kv_cache.capacity.memory_fraction"):
                    set_path(cfg, "engine.workers.aggregated.kv_cache.capacity", Replace(type="default"))
                    set_path(cfg, "engine.workers.aggregated.timing", Replace(type="default"))
                if key == "engine.mode":
                    worker = cfg["engine"]["workers"]["aggregated"]
                    cfg["engine"]["workers"].update(prefill=copy.deepcopy(worker), decode=copy.deepcopy(worker))
                if block:
                    tmpl = BLOCKS_RECOMMEND.get(block, BLOCKS[block])
                    if tmpl is not None:
                        set_path(cfg, block.replace("<role>", "aggregated"), tmpl)
                    for p, val in BLOCK_ALSO.get(block, {}).items():
                        set_path(cfg, p.replace("<role>", "aggregated"), val)
                set_path(cfg, rpath, {"choices": pair})
                cases.append({"id": f"{key}={{choices: {label_of(pair)}}}", "key": key, "section": rec["section"],
                              "label": "{choices: " + label_of(pair) + "}",
                              "base": "rec_planner" if key.startswith("planner.") else "rec_fixed",
                              "command": "recommend", "config": cfg, "override": {rpath: {"choices": pair}},
                              "neutral": False})
    for name in sorted(BASES):
        cmd, cfg, _ = BASES[name]
        cases.append({"id": f"{name}:base", "key": f"(base) {name}", "section": "base", "label": "base",
                      "base": name, "command": cmd, "config": copy.deepcopy(cfg), "override": {}, "neutral": True})
    return sorted(cases, key=lambda c: c["id"]), by_key


# ---------------------------------------------------------------------------------------------
# Running


def case_files(cfg):
    paths = ((cfg.get("traffic") or {}).get("source") or {}).get("paths") or []
    return [p for p in paths if isinstance(p, str) and os.path.exists(p)]


def content_hash(case, stack, ref_python):
    h = hashlib.sha256()
    h.update(json.dumps({"command": case["command"], "stack": stack, "config": case["config"],
                         "ref": os.path.realpath(ref_python)}, sort_keys=True).encode())
    for p in case_files(case["config"]):
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def stack_of(case):
    return "dynamo" if {"router", "planner"} & set(case["config"]) else "engine"


def run_servesim(binary, case, workdir):
    cfg_path = os.path.join(workdir, "config.yaml")
    with open(cfg_path, "w") as f:
        json.dump(case["config"], f, indent=1)  # JSON is YAML
    out = os.path.join(workdir, "out")
    args = [binary, case["command"], "-c", cfg_path, "--threads", "1", "--format", "json", "--output-dir", out,
            "--overwrite"]
    if case["command"] == "recommend":
        args.append("--no-cache")
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=workdir)
    except subprocess.TimeoutExpired:
        return {"ok": False, "exit": None, "message": "timeout after 600 s"}
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        msg = next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else "")
        # Without the run's temporary path, so that the report is the same on every run.
        msg = msg.replace(f"{cfg_path}: ", "").replace(cfg_path, "config.yaml").replace(workdir, "<tmp>")
        msg = msg[len("error: "):] if msg.startswith("error: ") else msg
        return {"ok": False, "exit": proc.returncode, "message": msg[:400]}
    name = "prediction.json" if case["command"] == "predict" else "recommendation.json"
    try:
        with open(os.path.join(out, name)) as f:
            result = json.load(f)
    except (OSError, ValueError) as exc:
        return {"ok": False, "exit": 0, "message": f"no {name}: {exc}"}
    return {"ok": True, "exit": 0, "result": result}


def run_reference(ref_python, dyn_python, case, workdir, cache_dir, use_reference):
    stack = stack_of(case)
    python = dyn_python if stack == "dynamo" else ref_python
    key = content_hash(case, stack, python or ref_python)
    path = os.path.join(cache_dir, key + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if not use_reference:
        return None
    if stack == "dynamo" and not (python and os.path.exists(python)):
        return {"ok": None,
                "message": "not run: the --stack dynamo venv (setup_aisimulate.sh --with-dynamo) is missing"}
    cfg_path = os.path.join(workdir, "ref-config.yaml")
    with open(cfg_path, "w") as f:
        json.dump(case["config"], f, indent=1)
    args = [python, os.path.join(SHARED, "parity", "aisimulate_predict.py"), cfg_path, "--stack", stack,
            "--command", case["command"]]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1800, cwd=workdir)
    except subprocess.TimeoutExpired:
        out = {"ok": False, "message": "timeout after 1800 s"}
    else:
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            lines = [ln for ln in lines if "execution process exited" not in ln]
            err = next((ln for ln in reversed(lines) if re.search(r"(Error|Exception)\b|error:", ln)),
                       lines[-1] if lines else "")
            out = {"ok": False, "message": err[:400]}
        else:
            result = json.loads(proc.stdout)
            if stack == "dynamo" and isinstance(result.get("summary"), dict):
                result = result["summary"]
            out = {"ok": True, "result": result}
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(out, f, sort_keys=True)
    os.replace(tmp, path)
    return out


def deviation(x, y):
    if y == 0:
        return abs(x)
    return abs(x - y) / abs(y)


def compare_flat(ours, ref, tol):
    """The worst metric; and the list of metrics beyond the tolerance."""
    bad, worst = [], (0.0, None)
    for k in sorted(set(ours) & set(ref)):
        x, y = ours[k], ref[k]
        if k in WALL_CLOCK or isinstance(x, bool) or isinstance(y, bool):
            continue
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            continue
        d = 0.0 if abs(x - y) <= 1e-9 else deviation(x, y)
        if k.startswith("std_") and isinstance(ref.get("mean_" + k[4:]), (int, float)) and ref["mean_" + k[4:]]:
            # A spread is compared relative to its metric's mean: a near-zero spread (constant steps)
            # would turn float noise into a large relative deviation.
            d = min(d, abs(x - y) / abs(ref["mean_" + k[4:]]))
        if d > worst[0]:
            worst = (d, k)
        if d > tol:
            bad.append({"metric": k, "servesim": x, "reference": y, "deviation": d})
    return worst, bad


PARALLEL_KNOBS = ("tensor", "replicas", "attention_data", "moe_tensor", "moe_expert", "pipeline")


AFD_TOPOLOGY = ("n_a_nodes", "n_f_nodes", "tp_a", "a_batch_size", "f_moe_ep_size", "num_microbatches",
                "pipeline_model")


def signature(candidate):
    """What tells candidates apart: mode, backend, each role's parallel shape and scheduler knobs,
    the router and planner sections (as both tools' `prediction_config` spell them), and an AFD
    candidate's topology (the reference writes no `prediction_config` for an AFD topology that
    failed to build: its searched `config` names it)."""
    pc = candidate.get("prediction_config") or {}
    engine = pc.get("engine") or {}
    searched = candidate.get("config") or {}
    mode = engine.get("mode") or searched.get("deployment_mode")
    if mode == "afd":
        afd = engine.get("afd") or searched.get("afd") or {}
        return json.dumps([mode, engine.get("backend") or searched.get("backend"),
                           {k: afd.get(k) for k in AFD_TOPOLOGY}], sort_keys=True)
    roles = {}
    for role, w in sorted((engine.get("workers") or {}).items()):
        if not isinstance(w, dict):
            continue
        par = w.get("parallelism") or {}
        sched = w.get("scheduler") or {}
        roles[role] = [par.get(k) or 1 for k in PARALLEL_KNOBS] + [sched.get("max_batched_tokens"),
                                                                   sched.get("max_sequences")]
    return json.dumps([engine.get("mode"), engine.get("backend"), roles, pc.get("router"), pc.get("planner")],
                      sort_keys=True)


def compare_recommend(ours, ref, tol, max_trials):
    """Candidates matched by signature. When a random search sampled fewer candidates than its
    space holds (either tool evaluated max_trials), only the candidates both evaluated are compared."""
    def cands(doc):
        out = {}
        for c in doc.get("candidates") or []:
            m = {k: v for k, v in (c.get("metrics") or {}).items() if isinstance(v, (int, float))}
            out.setdefault(signature(c), []).append((str(c.get("status")), c.get("used_gpus") or 0, m))
        for v in out.values():
            v.sort(key=lambda t: (t[0], t[1], t[2].get("mean_ttft_ms", 0), t[2].get("mean_e2e_latency_ms", 0)))
        return out
    a, b = cands(ours), cands(ref)
    sampled = max_trials is not None and max(sum(map(len, a.values())), sum(map(len, b.values()))) >= max_trials
    if set(a) != set(b) and not sampled:
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        return (1.0, "candidates"), [{"metric": "candidates", "servesim": f"{sum(map(len, a.values()))} "
                                      f"(only servesim: {only_a[:3]})", "reference": f"{sum(map(len, b.values()))} "
                                      f"(only reference: {only_b[:3]})", "deviation": 1.0}]
    common = sorted(set(a) & set(b))
    if not common:
        return (0.0, "sampled: no candidate in common"), []
    pairs = []
    for sig in common:
        if len(a[sig]) != len(b[sig]):
            return (1.0, "candidates"), [{"metric": f"candidates {sig}", "servesim": len(a[sig]),
                                          "reference": len(b[sig]), "deviation": 1.0}]
        pairs += [(f"{sig}#{j}", x, y) for j, (x, y) in enumerate(zip(a[sig], b[sig]))]
    worst, bad = (0.0, None), []
    for i, x, y in pairs:
        if x[0] == "unsupported" and y[0] != "unsupported":
            # servesim refuses a candidate the reference evaluates: a restriction, not a wrong answer.
            bad.append({"metric": f"candidate[{i}].status", "servesim": x[0], "reference": y[0], "deviation": 0.0,
                        "refused": True})
            continue
        if x[0] != y[0] or x[1] != y[1]:
            bad.append({"metric": f"candidate[{i}].status/gpus", "servesim": f"{x[0]}/{x[1]}",
                        "reference": f"{y[0]}/{y[1]}", "deviation": 1.0})
            worst = (1.0, f"candidate[{i}].status")
            continue
        w, bb = compare_flat(x[2], y[2], tol)
        if w[0] > worst[0]:
            worst = (w[0], f"candidate[{i}].{w[1]}")
        bad += [dict(e, metric=f"candidate[{i}].{e['metric']}") for e in bb]
    return worst, bad


def run_case(case, args, validity):
    out = {"id": case["id"], "valid": validity is None, "reference_validation": validity}
    with tempfile.TemporaryDirectory(prefix="yaml-census-") as wd:
        s = run_servesim(args.binary, case, wd)
        out["servesim"] = {k: v for k, v in s.items() if k != "result"}
        if not s["ok"]:
            if validity is not None:
                out["status"] = "probe"
                return out
            # A valid case servesim refuses: the reference's run may refuse it too (a value its
            # schema takes but its engine rejects), which is agreement, not a gap.
            r = run_reference(args.ref_python, args.dyn_python, case, wd, args.cache_dir, not args.no_reference)
            if r is not None and r.get("ok") is False:
                out["status"] = "both-refuse"
                out["reference"] = {"message": r["message"]}
            else:
                out["status"] = "refused"
            return out
        if validity is not None:
            out["status"] = "probe"
            out["flag"] = "servesim accepts a config the reference's schema refuses"
            return out
        r = run_reference(args.ref_python, args.dyn_python, case, wd, args.cache_dir, not args.no_reference)
    if r is None or r.get("ok") is None:
        out["status"] = "unchecked"
        out["reference"] = {"message": (r or {}).get("message", "no cached reference result (--no-reference)")}
        return out
    if not r["ok"]:
        out["status"] = "ref-fails"
        out["reference"] = {"message": r["message"]}
        out["flag"] = "servesim accepts, the reference's run fails"
        return out
    if case["command"] == "predict":
        worst, bad = compare_flat(s["result"], r["result"], args.tolerance)
    else:
        trials = (case["config"].get("optimizer") or {}).get("max_trials")
        worst, bad = compare_recommend(s["result"], r["result"], args.tolerance, trials)
        sa = [signature(c) for c in s["result"].get("candidates") or []]
        sb = [signature(c) for c in r["result"].get("candidates") or []]
        out["candidates"] = {"servesim": len(sa), "reference": len(sb),
                             "compared": sum(min(sa.count(x), sb.count(x)) for x in set(sa) & set(sb))}
    out["worst"] = {"deviation": worst[0], "metric": worst[1]}
    refused = [b for b in bad if b.get("refused")]
    bad = [b for b in bad if not b.get("refused")]
    if refused and not bad:
        out["status"] = "partly-refused"
        reasons = sorted({str(c.get("reason")) for c in s["result"].get("candidates") or []
                          if c.get("status") == "unsupported"})
        out["servesim"]["message"] = (f"{len(refused)} candidate(s) unsupported that the reference evaluates: "
                                      + " / ".join(reasons))
        out["refused_candidates"] = refused
        return out
    if worst[1] and worst[1].startswith("sampled"):
        out["status"] = "unchecked"
        out["reference"] = {"message": "both random searches sampled the space; no candidate in common"}
        return out
    out["status"] = "differs" if bad else "accepted"
    if bad:
        out["differences"] = bad[:12]
        out["flag"] = "accepted but differs"
    return out


# ---------------------------------------------------------------------------------------------
# Report

ICON = {"accepted": "✅ accepted", "restricted": "⚠️ restricted", "refused": "❌ refused",
        "differs": "🟥 differs",
        "untested": "⬜ untested"}


def classify_key(results):
    # A case servesim runs but the reference's run refuses is flagged, not counted for the key.
    valid = [r for r in results if r["valid"] and r["status"] != "ref-fails"]
    if not valid:
        return "untested"
    if any(r["status"] in ("differs",) for r in valid):
        return "differs"
    if any(r["status"] == "partly-refused" for r in valid):
        return "restricted"
    ok = [r for r in valid if r["status"] in ("accepted", "unchecked", "both-refuse")]
    ok_non_neutral = [r for r in ok if not r["neutral"] and r["status"] != "both-refuse"]
    if not ok_non_neutral and any(r["status"] == "refused" for r in valid):
        return "refused"
    # Cases both tools refuse agree: a key with no other outcome is accepted (marked in the table).
    if len(ok) == len(valid):
        return "accepted"
    return "restricted"


def section_of(key):
    if key.startswith("engine.workers.<role>"):
        return "engine.workers.<role> (aggregated / prefill / decode)"
    if key.startswith("engine.workers.encoder"):
        return "engine.workers.encoder"
    for s in ("engine.kv_transfer", "engine.speculation", "engine.tokenization", "engine.afd", "engine.fpm_profile"):
        if key.startswith(s + ".") or key == s:
            return s
    if key.startswith("engine."):
        return "engine (top level)"
    if key.startswith(("evaluation", "execution")):
        return "evaluation / execution"
    if key.startswith(("optimization", "optimizer")):
        return "optimization / optimizer (recommend)"
    if key.startswith("router."):
        return "router: (Dynamo adapter)"
    if key.startswith("planner."):
        return "planner: (Dynamo adapter)"
    return key.split(".")[0]


def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def report(cases, results, by_key, args):
    per_key = {}
    for c in cases:
        r = results[c["id"]]
        r["neutral"] = c["neutral"]
        per_key.setdefault(c["key"], []).append((c, r))
    lines = []
    lines.append(f"Unified-YAML census: {len([k for k in per_key if not k.startswith('(base)')])} keys, "
                 f"{len(cases)} cases (tolerance {args.tolerance * 100:g} % relative).")
    lines.append("")
    lines.append("Bases: " + "; ".join(f"`{n}` = {BASES[n][2]}" for n in sorted(BASES)) + ".")
    lines.append("")
    sections = {}
    totals = {}
    for key in sorted(per_key):
        if key.startswith("(base)"):
            continue
        status = classify_key([r for _, r in per_key[key]])
        sections.setdefault(section_of(key), []).append((key, status))
        totals[status] = totals.get(status, 0) + 1
    counts_order = ["accepted", "restricted", "refused", "differs", "untested"]
    lines.append("| census | keys | " + " | ".join(counts_order) + " |")
    lines.append("|---|---|" + "---|" * len(counts_order))
    lines.append(f"| all | {sum(totals.values())} | " + " | ".join(str(totals.get(s, 0)) for s in counts_order) + " |")
    for sec in sorted(sections):
        t = {}
        for _, st in sections[sec]:
            t[st] = t.get(st, 0) + 1
        lines.append(f"| {sec} | {len(sections[sec])} | " + " | ".join(str(t.get(s, 0)) for s in counts_order) + " |")
    lines.append("")
    case_totals = {}
    for r in results.values():
        case_totals[r["status"]] = case_totals.get(r["status"], 0) + 1
    lines.append("Cases: " + ", ".join(f"{k} {case_totals[k]}" for k in sorted(case_totals)) + ".")
    lines.append("")
    # Base cases.
    lines.append("Base cases (unmodified): " + ", ".join(
        f"`{c['base']}` {results[c['id']]['status']}"
        + (f" (worst {results[c['id']]['worst']['deviation'] * 100:.3g} % {results[c['id']]['worst']['metric']})"
           if (results[c['id']].get('worst') or {}).get('metric') else " (exact)" if results[c['id']].get('worst')
           else "")
        for c in cases if c["section"] == "base") + ".")
    lines.append("")
    for sec in sorted(sections):
        t = {}
        for _, st in sections[sec]:
            t[st] = t.get(st, 0) + 1
        lines.append(f"#### {sec} — {len(sections[sec])} keys: " + ", ".join(
            f"{t[s]} {s}" for s in counts_order if t.get(s)))
        lines.append("")
        lines.append("| key | commands | status | values tried (base) → outcome | servesim message (refusals) |")
        lines.append("|---|---|---|---|---|")
        for key, status in sections[sec]:
            tried, msgs = [], []
            for c, r in per_key[key]:
                mark = {"accepted": "✓", "unchecked": "✓?", "refused": "✗", "differs": "≠", "probe": "probe",
                        "ref-fails": "✓ (ref fails)", "partly-refused": "✓/✗",
                        "both-refuse": "✗✗ (both refuse)"}[r["status"]]
                n = r.get("candidates")
                if n and r["status"] == "accepted" and n["compared"] < max(n["servesim"], n["reference"]):
                    mark += f" ({n['compared']} of {n['servesim']}/{n['reference']} candidates compared)"
                tried.append(f"{c['label']} ({c['base']}) {mark}")
                if r["status"] in ("refused", "partly-refused"):
                    m = r["servesim"]["message"]
                    if m not in msgs:
                        msgs.append(m)
                elif r["status"] == "both-refuse":
                    ref = re.sub(r"/tmp/aisim-\w+/", "<tmp>/", r["reference"]["message"])
                    m = f"both refuse — servesim: {r['servesim']['message']}; reference: {ref}"
                    if m not in msgs:
                        msgs.append(m)
            cmds = "/".join(by_key[key]["commands"]) if key in by_key else ""
            shown = ICON[status]
            if status == "accepted" and any(r["status"] == "both-refuse" for _, r in per_key[key]):
                shown += " (both refuse some values)"
            lines.append(f"| `{key}` | {cmds} | {shown} | {md_escape('; '.join(tried))} | "
                         f"{md_escape(' / '.join(msgs))} |")
        lines.append("")
    lines.append("Outcomes: ✓ accepted and agrees with the reference, ✓? accepted, reference not run, ✗ refused by "
                 "servesim, ≠ accepted but differs, probe = the reference's schema refuses the case, "
                 "✓ (ref fails) = servesim runs what the reference's run refuses, ✓/✗ = servesim marks some "
                 "recommend candidates unsupported that the reference evaluates, ✗✗ (both refuse) = servesim "
                 "refuses a case the reference's run fails on too (both messages shown).")
    lines.append("")
    flagged = [(c, results[c["id"]]) for c in cases if results[c["id"]].get("flag")]
    unknown = [(c, results[c["id"]]) for c in cases
               if results[c["id"]]["valid"] and "unknown key" in results[c["id"]].get("servesim", {}).get("message", "")
               and c["section"] != "base"]
    lines.append(f"#### Flags — {len(flagged)} cases")
    lines.append("")
    if not flagged:
        lines.append("None: no accepted case differs, and servesim refuses every case the reference refuses.")
    for c, r in flagged:
        lines.append(f"- **{r['flag']}**: `{c['id']}` (base `{c['base']}`, override "
                     f"`{json.dumps(c['override'], sort_keys=True)}`)")
        if r.get("differences"):
            for d in r["differences"][:6]:
                lines.append(f"  - {d['metric']}: servesim {d['servesim']}, reference {d['reference']} "
                             f"({d['deviation'] * 100:.3g} %)")
        if r.get("reference_validation"):
            lines.append(f"  - reference schema: {r['reference_validation']}")
        if r.get("reference", {}).get("message"):
            msg = re.sub(r"/tmp/aisim-\w+/", "<tmp>/", r["reference"]["message"])
            lines.append(f"  - reference run: {msg}")
    lines.append("")
    lines.append(f"#### servesim says \"unknown key\" for a documented key — {len(unknown)} cases")
    lines.append("")
    for c, r in unknown:
        lines.append(f"- `{c['id']}`: {r['servesim']['message']}")
    lines.append("")
    return "\n".join(lines), totals


def main():
    if "--ref-helper" in sys.argv:
        return ref_helper()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    venv = os.environ.get("AISIM_REF_VENV", "/tmp/servesim-aisim-ref")
    dyn = os.environ.get("AISIM_DYN_VENV", "/tmp/servesim-aisim-dyn")
    site = sorted(glob.glob("/tmp/servesim-dynamo-ref/lib/python3*/site-packages"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "servesim"))
    ap.add_argument("--ref-python", default=os.path.join(venv, "bin", "python"))
    ap.add_argument("--dyn-python", default=os.path.join(dyn, "bin", "python"),
                    help="python of the --stack dynamo venv (router:/planner: reference runs)")
    ap.add_argument("--dynamo-site", default=site[0] if site else None,
                    help="site-packages holding Dynamo 1.6.1 (the router/planner adapter schemas)")
    ap.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "servesim-yaml-census"))
    ap.add_argument("--tolerance", type=float, default=0.005)
    ap.add_argument("--only", metavar="SUBSTRING", help="only the cases whose key contains this")
    ap.add_argument("--no-reference", action="store_true", help="use cached reference results only")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--list", action="store_true", help="print the cases (id, base, override) and stop")
    ap.add_argument("--json", metavar="OUT", help="write every case and its results here")
    args = ap.parse_args()

    if not args.list and not os.access(args.binary, os.X_OK):
        sys.exit(f"yaml_census: no servesim binary at {args.binary} (cargo build --release -p servesim, or --binary)")
    if not os.access(args.ref_python, os.X_OK):
        sys.exit(f"yaml_census: no reference python at {args.ref_python} (../shared/parity/setup_aisimulate.sh)")
    walked = call_helper(args.ref_python, {"op": "walk", "dynamo_site": args.dynamo_site})
    if walked.get("adapter_error"):
        print(f"yaml_census: router/planner schemas not loaded: {walked['adapter_error']}", file=sys.stderr)
    systems = os.environ.get("SERVESIM_AIS_SYSTEMS") or os.path.join(
        os.path.dirname(os.path.dirname(args.ref_python)), "lib", "python3.11", "site-packages", "aisimulate_core",
        "systems")
    cases, by_key = make_cases(walked["keys"], systems)
    if args.only:
        cases = [c for c in cases if args.only in c["key"]]
    if args.list:
        for c in cases:
            print(f"{c['id']}\t{c['command']}\t{c['base']}\t{json.dumps(c['override'], sort_keys=True)}")
        print(f"{len(cases)} cases, {len(by_key)} keys", file=sys.stderr)
        return 0
    validity = call_helper(args.ref_python, {"op": "validate", "dynamo_site": args.dynamo_site,
                                             "cases": [{"id": c["id"], "command": c["command"], "config": c["config"]}
                                                       for c in cases]})
    env_systems = os.environ.setdefault("SERVESIM_AIS_SYSTEMS", systems)
    os.environ.setdefault("AISIM_REF_VENV", os.path.dirname(os.path.dirname(args.ref_python)))
    if os.path.exists(args.dyn_python):
        # servesim runs Dynamo's own ARIMA / Prophet load predictors through this interpreter.
        os.environ.setdefault("SERVESIM_PLANNER_PYTHON", args.dyn_python)
    del env_systems
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_case, c, args, validity[c["id"]]): c for c in cases}
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            c = futures[fut]
            results[c["id"]] = fut.result()
            print(f"[{i + 1}/{len(cases)}] {results[c['id']]['status']:10s} {c['id']}", file=sys.stderr)
    text, totals = report(cases, results, by_key, args)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tolerance": args.tolerance, "totals": totals,
                       "cases": [dict(c, result=results[c["id"]]) for c in cases]}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
