"""Builds the small planner-profiler results directories under this directory (Dynamo's
profiler layout: JSON form and NPZ form, plus edge cases) and records what Dynamo 1.6.1's
``convert_profile_results_to_npz`` makes of them into ``golden.json``.

Run with the Dynamo + aisimulate venv (the reference converter imports ``aisimulate_core``,
numpy and scikit-learn):

    $(../shared/parity/setup_aisimulate.sh --with-dynamo) tests/python/data/profiler/record.py

(from the checkout's root). tests/python/test_profile_converter.py compares servesim's converter
with ``golden.json``.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write_json_dir(name, prefill, decode):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "prefill_raw_data.json"), "w") as f:
        json.dump(prefill, f)
    with open(os.path.join(d, "decode_raw_data.json"), "w") as f:
        json.dump(decode, f)


def build_inputs():
    # The JSON form: a prefill sweep and a decode sweep over three context lengths.
    write_json_dir(
        "json_dir",
        {"prefill_isl": [128, 256, 512, 1024, 2048, 4096, 8192],
         "prefill_ttft": [14.2, 19.8, 31.5, 58.1, 110.7, 223.9, 489.3]},
        {"x_kv_usage": [0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.05, 0.2, 0.5, 0.9, 0.3, 0.7],
         "y_context_length": [512, 512, 512, 512, 512, 512, 2048, 2048, 2048, 2048, 8192, 8192],
         "z_itl": [7.1, 7.9, 9.2, 12.0, 14.8, 17.9, 6.9, 8.8, 13.1, 19.6, 10.9, 16.2],
         "max_kv_tokens": 300000},
    )
    # The NPZ form (selected_*_interpolation/raw_data.npz), with a pass measured at 0 ms.
    d = os.path.join(HERE, "npz_dir")
    os.makedirs(os.path.join(d, "selected_prefill_interpolation"), exist_ok=True)
    os.makedirs(os.path.join(d, "selected_decode_interpolation"), exist_ok=True)
    np.savez(os.path.join(d, "selected_prefill_interpolation", "raw_data.npz"),
             prefill_isl=np.array([100.0, 300.0, 900.0, 2700.0, 8100.0, 500.0]),
             prefill_ttft=np.array([9.0, 16.5, 40.2, 118.0, 377.5, 0.0]))
    np.savez(os.path.join(d, "selected_decode_interpolation", "raw_data.npz"),
             x_kv_usage=np.array([0.02, 0.1, 0.3, 0.6, 0.95, 0.15, 0.45, 0.85]),
             y_context_length=np.array([1000.0] * 5 + [6000.0] * 3),
             z_itl=np.array([5.5, 6.8, 9.9, 14.6, 20.2, 6.0, 9.1, 13.9]),
             max_kv_tokens=np.array([500000]))
    decode = {"x_kv_usage": [0.1, 0.2, 0.4, 0.8], "y_context_length": [100, 1000, 4000, 1000],
              "z_itl": [9.0, 7.0, 8.0, 12.0], "max_kv_tokens": 100000}
    line = {"prefill_isl": [100, 200], "prefill_ttft": [10, 20]}
    # A negative batch-size coefficient (set to 0 after the fit).
    write_json_dir("neg_batch", line, decode)
    # Prefill time falling with the prompt: the fit is refused.
    write_json_dir("neg_prefill", {"prefill_isl": [100, 200, 400], "prefill_ttft": [30, 20, 10]}, decode)
    # One measurement per sweep.
    write_json_dir("one_point", {"prefill_isl": [512], "prefill_ttft": [40]},
                   {"x_kv_usage": [0.5], "y_context_length": [1000], "z_itl": [9.0], "max_kv_tokens": 100000})
    # Decode time falling with the KV tokens: refused.
    write_json_dir("neg_kv", line, {"x_kv_usage": [0.1, 0.2, 0.4, 0.8], "y_context_length": [1000] * 4,
                                    "z_itl": [20.0, 15.0, 10.0, 5.0], "max_kv_tokens": 100000})
    # Requests and KV tokens proportional (a rank-deficient decode fit).
    write_json_dir("collinear", line, {"x_kv_usage": [0.1, 0.2, 0.4, 0.8], "y_context_length": [1000] * 4,
                                       "z_itl": [5.0, 7.0, 11.0, 19.5], "max_kv_tokens": 100000})
    # Every prefill measured at 0 ms: nothing to fit.
    write_json_dir("zero_times", {"prefill_isl": [100, 200], "prefill_ttft": [0, 0]}, decode)


CASES = [("json_dir", 7), ("npz_dir", 7), ("json_dir", 100), ("neg_batch", 5), ("neg_prefill", 5),
         ("one_point", 5), ("neg_kv", 5), ("collinear", 5), ("zero_times", 5)]


def record():
    import tempfile

    from dynamo.mocker.utils.planner_profiler_perf_data_converter import convert_profile_results_to_npz

    golden = {}
    for name, resolution in CASES:
        key = f"{name}@{resolution}"
        with tempfile.TemporaryDirectory() as tmp:
            try:
                out = convert_profile_results_to_npz(os.path.join(HERE, name), os.path.join(tmp, "perf_data.npz"),
                                                     resolution)
                with np.load(out) as d:
                    arrays = {k: d[k].tolist() for k in d.files}
            except Exception as e:
                golden[key] = {"error": type(e).__name__, "message": str(e)}
                continue
        if resolution == 100:
            # Keep the file small: the axes, and three rows of the 100 x 100 decode table.
            arrays["decode_itl"] = {str(i): arrays["decode_itl"][i] for i in (0, 37, 99)}
        golden[key] = arrays
    with open(os.path.join(HERE, "golden.json"), "w") as f:
        json.dump(golden, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    build_inputs()
    if "--inputs-only" not in sys.argv:
        record()
