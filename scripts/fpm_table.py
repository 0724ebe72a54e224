#!/usr/bin/env python3
"""Write a small, deterministic FPM forward-pass table (aisimulate 0.13's `aic_fpm_forward_perf`
schema 7 parquet + its `.metadata.json` sidecar with the parquet's sha256) for one identity:
Qwen/Qwen3-8B on one h200_sxm under vLLM 0.24.0, bf16, TP1.

Usage: $AISIM_REF_VENV/bin/python scripts/fpm_table.py OUT_DIR [--version 0.24.0]
           [--model M --system S --backend B --cell ID] [--par tp=8,moe_tp=8,...] [--quant kv_cache_dtype=fp8,...]
           [--decode-batches 1,2,4,5,8,9,16] [--decode-context 256,4096,256]
           [--prefill-kv 4096,16384 [--prefill-kv-batches 1,2,4,8,16]] [--prefill-min-tokens 8]
Writes OUT_DIR/fpm_forward_perf.parquet and OUT_DIR/fpm_forward_perf.metadata.json; the same
arguments always give byte-identical files (the test suite regenerates them).

The latencies are a plausible closed form, not measurements: a dense 8B model on an H200 whose
forward pass costs a fixed launch overhead, a weight-read floor, a per-token GEMM cost, an
attention cost per (new token x context token) in prefill and per KV token read in decode, and
a small per-request cost. Rounded to 1e-6 ms so both tools read identical doubles.

Grid (what servesim's interpolation needs for a vLLM aggregated replay of uniform prompts):
- prefill sites (batch, total KV read) = (1..16, 0), each with a new-token curve over
  256 .. 16384 tokens (every multiple of 256 up to 4096, then powers of two);
- decode curves for every batch 1..16 over total KV read tokens batch x (960 .. 1280, step 64),
  i.e. a per-request context of 960..1280 tokens.
--decode-batches collects decode curves for those batches only (the prefill grid is unchanged):
a pair (x, x+1) marks a capture rung, so an uncollected batch between rungs is priced from its
bracket rows; --decode-context LO,HI,STEP sets the per-request context range of the decode curves.
--prefill-kv adds prefill sites at those total KV reads (for the batches of --prefill-kv-batches,
default all), each with a new-token curve over the multiples of 256 up to 4096 only.
--prefill-min-tokens N extends every prefill curve down to N new tokens (the powers of two from N
below 256, at least the batch), so that chunk remainders of a few tokens lie inside the domain.
--model / --system / --backend / --cell, --par (tp, pp, dp, moe_tp, moe_ep, cp, each 1 by default) and
--quant (any IDENTITY column) write the rows for another deployment (the DSA goldens: DeepSeek-V3.2 on
an H200 TP8 under SGLang); the latencies keep the same closed form.
servesim's per-pass goldens (crates/perf/tests/fpm_passes.rs) use
--decode-batches 1,2,4,5,8,9,16 --decode-context 256,4096,256 --prefill-kv 4096,16384
--prefill-kv-batches 1,2,4,8,16.
"""
import argparse
import hashlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

MODEL = "Qwen/Qwen3-8B"
SYSTEM = "h200_sxm"
BACKEND = "vllm"
BATCHES = range(1, 17)
PREFILL_TOKENS = sorted(set(list(range(256, 4097, 256)) + [8192, 16384]))
DECODE_CONTEXT = range(960, 1281, 64)

IDENTITY = {
    "weight_quantization": "bfloat16",
    "gemm_quant_mode": "bfloat16",
    "moe_quant_mode": "bfloat16",
    "fmha_quant_mode": "bfloat16",
    "comm_quant_mode": "half",
    "kv_cache_dtype": "bfloat16",
    "moe_backend": "auto",
    "attention_backend": "auto",
    "model_config_sha256": "",
    "execution_profile": "full",
    "engram_residency": "none",
    "input_modality": "text",
}


def prefill_ms(batch, tokens, kv):
    # launch + weight floor, GEMM per token, attention per (new x context) pair
    pairs = tokens * (tokens / batch / 2.0 + kv / batch)
    return 4.0 + 0.055 * tokens / 1.0 + 0.38e-6 * pairs * 1.0 + 0.02 * batch


def decode_ms(batch, kv):
    return 6.2 + 0.045 * batch + 0.21e-3 * kv


def rows(decode_batches, decode_context, prefill_kv=(), prefill_kv_batches=BATCHES, min_tokens=256):
    out = []
    small = []
    while min_tokens < 256:
        small.append(min_tokens)
        min_tokens *= 2
    tokens = small + PREFILL_TOKENS
    for b in BATCHES:
        for t in tokens:
            if t < b:
                continue
            out.append(("prefill", b, t, 0, prefill_ms(b, t, 0)))
        if b not in prefill_kv_batches:
            continue
        for kv in prefill_kv:
            for t in tokens:
                if b <= t <= 4096:
                    out.append(("prefill", b, t, kv, prefill_ms(b, t, kv)))
    for b in decode_batches:
        for c in decode_context:
            out.append(("decode", b, 0, b * c, decode_ms(b, b * c)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--version", default="0.24.0")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--system", default=SYSTEM)
    ap.add_argument("--backend", default=BACKEND)
    ap.add_argument("--cell", default="qwen3_8b_tp1", help="the rows' cell_id")
    ap.add_argument("--par", default="", help="comma-separated k=v parallel sizes (tp, pp, dp, moe_tp, moe_ep, cp)")
    ap.add_argument("--quant", default="", help="comma-separated k=v overrides of the identity columns")
    ap.add_argument("--decode-batches", help="comma-separated decode batches (default 1..16)")
    ap.add_argument("--decode-context", help="LO,HI,STEP per-request decode context (default 960,1280,64)")
    ap.add_argument("--prefill-kv", help="comma-separated total KV reads of extra prefill sites (default none)")
    ap.add_argument("--prefill-kv-batches", help="comma-separated batches of those sites (default 1..16)")
    ap.add_argument("--prefill-min-tokens", type=int, default=256, help="shortest prefill curve point (default 256)")
    ap.add_argument("--dcp", help="comma-separated decode context parallel sizes: a dcp column, one cell per size")
    ap.add_argument("--selector-dcp", type=int, help="the sidecar's configuration_selector.dcp")
    a = ap.parse_args()
    decode_context = DECODE_CONTEXT
    if a.decode_context:
        lo, hi, step = (int(v) for v in a.decode_context.split(","))
        decode_context = range(lo, hi + 1, step)
    decode_batches = sorted({int(b) for b in a.decode_batches.split(",")}) if a.decode_batches else BATCHES
    prefill_kv = sorted({int(v) for v in a.prefill_kv.split(",")}) if a.prefill_kv else ()
    kv_batches = {int(b) for b in a.prefill_kv_batches.split(",")} if a.prefill_kv_batches else set(BATCHES)
    par = dict.fromkeys(("tp", "pp", "dp", "moe_tp", "moe_ep", "cp"), 1)
    for kv in filter(None, a.par.split(",")):
        k, v = kv.split("=")
        assert k in par, k
        par[k] = int(v)
    identity = dict(IDENTITY)
    for kv in filter(None, a.quant.split(",")):
        k, v = kv.split("=")
        assert k in identity, k
        identity[k] = v
    os.makedirs(a.out_dir, exist_ok=True)
    dcps = [int(v) for v in a.dcp.split(",")] if a.dcp else [None]
    data = {k: [] for k in (
        "cell_id", "model_path", "system", "backend", "backend_version", *IDENTITY.keys(),
        "tp", "pp", "dp", "moe_tp", "moe_ep", "cp", "enable_wideep", "enable_eplb",
        "workload_kind", "partition_policy", "batch_size", "total_prefill_tokens",
        "total_kv_read_tokens", "latency_ms", *(["dcp"] if a.dcp else []))}
    cells = [(dcp, row) for dcp in dcps
             for row in rows(decode_batches, decode_context, prefill_kv, kv_batches, a.prefill_min_tokens)]
    for dcp, (kind, b, t, kv, ms) in cells:
        if dcp is not None:
            # a DCP cell's latencies: the decode KV read is striped over the group
            data["dcp"].append(dcp)
            if kind == "decode":
                ms = decode_ms(b, kv / dcp) + 0.01 * (dcp - 1)
        data["cell_id"].append(a.cell if dcp is None else f"{a.cell}_dcp{dcp}")
        data["model_path"].append(a.model)
        data["system"].append(a.system)
        data["backend"].append(a.backend)
        data["backend_version"].append(a.version)
        for k, v in identity.items():
            data[k].append(v)
        for k, v in par.items():
            data[k].append(v)
        data["enable_wideep"].append(False)
        data["enable_eplb"].append(False)
        data["workload_kind"].append(kind)
        data["partition_policy"].append("balanced_v1")
        data["batch_size"].append(b)
        data["total_prefill_tokens"].append(t)
        data["total_kv_read_tokens"].append(kv)
        data["latency_ms"].append(round(ms, 6))
    types = {k: pa.string() for k in data}
    for k in ("tp", "pp", "dp", "moe_tp", "moe_ep", "cp", "batch_size", "total_prefill_tokens",
              "total_kv_read_tokens", "dcp"):
        types[k] = pa.int64()
    types["enable_wideep"] = types["enable_eplb"] = pa.bool_()
    types["latency_ms"] = pa.float64()
    table = pa.table({k: pa.array(v, type=types[k]) for k, v in data.items()})
    path = os.path.join(a.out_dir, "fpm_forward_perf.parquet")
    pq.write_table(table, path, compression="none", write_statistics=False)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    sidecar = {
        "schema_name": "aic_fpm_forward_perf",
        "schema_version": 7,
        "coordinate_system": "iteration_totals_balanced_v1",
        "measurement_policy": "dynamo_native_single_sample_v1",
        "system": a.system,
        "backend": a.backend,
        "backend_version": a.version,
        "row_count": table.num_rows,
        "parquet_sha256": digest,
    }
    if a.selector_dcp is not None:
        sidecar["configuration_selector"] = {"dcp": a.selector_dcp}
    with open(os.path.join(a.out_dir, "fpm_forward_perf.metadata.json"), "w") as f:
        json.dump(sidecar, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{path}: {table.num_rows} rows, sha256 {digest}")


if __name__ == "__main__":
    main()
