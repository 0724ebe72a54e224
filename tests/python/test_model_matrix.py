"""The model support matrix sweep (scripts/model_matrix.py): which rows become cells, which cell
--quick keeps per model, how a cell's two outcomes are classified, and the report. Tiny in-test
inputs; nothing runs."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import model_matrix as mm  # noqa: E402


def row(model, system, backend, version, mode="agg", status="PASS", arch="Qwen3ForCausalLM"):
    return {"HuggingFaceID": model, "Architecture": arch, "System": system, "Backend": backend,
            "Version": version, "Mode": mode, "Status": status}


ROWS = [
    row("Qwen/Qwen3-8B", "h100_sxm", "vllm", "0.24.0"),
    row("Qwen/Qwen3-8B", "h200_sxm", "trtllm", "1.3.0"),
    row("Qwen/Qwen3-8B", "h200_sxm", "sglang", "0.5.9"),
    row("Qwen/Qwen3-8B", "h200_sxm", "sglang", "0.5.14"),
    row("Qwen/Qwen3-8B", "h200_sxm", "sglang", "0.5.14"),             # duplicate row
    row("Qwen/Qwen3-8B", "h200_sxm", "vllm", "0.24.0", mode="disagg"),
    row("Qwen/Qwen3-8B", "h200_sxm", "vllm", "0.24.0", status="FAIL"),
    row("Qwen/Qwen3-8B", "b200_sxm", "vllm", "0.24.0"),
    row("deepseek-ai/DeepSeek-V3", "a100_sxm", "vllm", "0.24.0", arch="DeepseekV3ForCausalLM"),
    row("deepseek-ai/DeepSeek-V3", "b200_sxm", "trtllm", "1.3.0rc5", arch="DeepseekV3ForCausalLM"),
    row("deepseek-ai/DeepSeek-V3", "b200_sxm", "trtllm", "1.3.0", arch="DeepseekV3ForCausalLM"),
    row("deepseek-ai/DeepSeek-V3", "l40s", "sglang", "0.5.14", arch="DeepseekV3ForCausalLM"),
]


def test_cells_are_the_deduplicated_agg_pass_rows():
    cells = mm.read_cells(ROWS)
    assert len(cells) == 9
    assert all(c["version"] != "0.24.0" or c["system"] != "h200_sxm" or c["backend"] != "vllm" for c in cells)
    assert [c["family"] for c in cells] == ["DeepseekV3ForCausalLM"] * 4 + ["Qwen3ForCausalLM"] * 5


def test_versions_order_numerically_and_a_release_after_its_candidates():
    assert mm.version_key("0.5.9") < mm.version_key("0.5.14")
    assert mm.version_key("1.3.0rc5") < mm.version_key("1.3.0")
    assert mm.version_key("0.24.0") < mm.version_key("1.0.0rc1")


def test_quick_prefers_h200_then_b200_then_vllm_sglang_trtllm_then_the_newest_version():
    picked = {c["model"]: c for c in mm.select(mm.read_cells(ROWS), quick=True)}
    q = picked["Qwen/Qwen3-8B"]
    # h200 has no agg PASS vLLM row, so SGLang's newest version there beats b200's vLLM.
    assert (q["system"], q["backend"], q["version"]) == ("h200_sxm", "sglang", "0.5.14")
    d = picked["deepseek-ai/DeepSeek-V3"]
    assert (d["system"], d["backend"], d["version"]) == ("b200_sxm", "trtllm", "1.3.0")


def test_quick_without_a_preferred_system_takes_the_first_by_name():
    rows = [row("m/x", "l40s", "vllm", "1"), row("m/x", "a100_sxm", "trtllm", "1")]
    (c,) = mm.select(mm.read_cells(rows), quick=True)
    assert c["system"] == "a100_sxm"


def test_filters_match_model_substrings_and_exact_systems_and_backends():
    cells = mm.read_cells(ROWS)
    assert {c["model"] for c in mm.select(cells, models=["qwen3-8"])} == {"Qwen/Qwen3-8B"}
    sel = mm.select(cells, systems=["h200_sxm", "b200_sxm"], backends=["trtllm"])
    assert sorted((c["system"], c["version"]) for c in sel) == [
        ("b200_sxm", "1.3.0"), ("b200_sxm", "1.3.0rc5"), ("h200_sxm", "1.3.0")]


def test_moe_is_read_from_the_model_config_including_nested_text_config():
    assert mm.is_moe({"num_experts": 128})
    assert mm.is_moe({"text_config": {"n_routed_experts": 256}})
    assert not mm.is_moe({"num_experts": 1, "hidden_size": 4096})
    assert mm.layout(4, True) == {"tensor": 4, "moe_tensor": 1, "moe_expert": 4}
    assert mm.layout_label(mm.layout(4, True)) == "TEP4" and mm.layout_label(mm.layout(2, False)) == "TP2"


def test_the_config_carries_the_cell_and_leaves_the_kv_cache_to_the_memory_model():
    cell = {"family": "f", "model": "Qwen/Qwen3-8B", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14"}
    cfg = mm.make_config(cell, mm.layout(2, False))
    eng = cfg["engine"]
    assert (eng["hardware"], eng["backend"], eng["backend_version"]) == ("h200_sxm", "sglang", "0.5.14")
    worker = eng["workers"]["aggregated"]
    assert worker["timing"] == {"type": "default"} and "kv_cache" not in worker
    assert worker["parallelism"] == {"tensor": 2}
    assert mm.dump_yaml(cfg) == mm.dump_yaml(mm.make_config(dict(cell), mm.layout(2, False)))


def ok(ttft, itl, kv):
    return {"ok": True, "metrics": {"mean_ttft_ms": ttft, "mean_itl_ms": itl}, "kv_tokens": kv}


def fail(msg):
    return {"ok": False, "error": msg}


def test_classification_within_and_beyond_the_tolerance():
    ref = ok(100.0, 10.0, 782464)
    assert mm.classify(ok(100.05, 10.0, 782464), ref, 0.001)[0] == "match"
    status, worst, dev, text = mm.classify(ok(100.0, 10.02, 782464), ref, 0.001)
    assert (status, worst) == ("differs", "mean_itl_ms") and abs(dev - 0.002 / 1.002) < 1e-9
    assert "mean_itl_ms 0.2 %" in text
    status, worst, _, text = mm.classify(ok(100.0, 10.0, 781000), ref, 0.001)
    assert (status, worst) == ("differs", "kv_tokens") and "(781000 vs 782464)" in text
    # A KV capacity one side could not report is a difference, not a match.
    status, worst, dev, text = mm.classify(ok(100.0, 10.0, None), ref, 0.001)
    assert (status, worst, dev) == ("differs", "kv_tokens", float("inf")) and "missing" in text


def test_classification_of_failures():
    good = ok(1.0, 1.0, 64)
    assert mm.classify(fail("engine.workers.aggregated.timing: unsupported; supported: A"), good, 0.001) == (
        "servesim refuses", None, None, "unsupported")
    assert mm.classify(good, fail("boom"), 0.001)[0] == "reference fails"
    assert mm.classify(fail("a"), fail("b"), 0.001) == ("both fail", None, None, "servesim: a; reference: b")
    assert mm.classify(good, None, 0.001)[0] == "unchecked"


def test_errors_lose_paths_and_reasons_lose_the_supported_list():
    out = ("warming up\nError: /tmp/matrix-ss-x/cfg.yaml: engine.workers.aggregated.timing: "
           "/opt/venv/model_configs/m--x_config.json: architecture X is not supported; supported: A, B\n")
    err = mm.error_of(out)
    assert err == "engine.workers.aggregated.timing: architecture X is not supported; supported: A, B"
    assert mm.shorten(err) == "architecture X is not supported"
    ref = "aisimulate predict failed: ValueError: no KV budget\naisimulate: execution process exited with status 1\n"
    assert mm.error_of(ref) == "ValueError: no KV budget"
    assert mm.LAYOUT_RETRY.search(mm.error_of(ref))
    assert len(mm.shorten("x" * 500)) == 160


def test_quick_prefers_the_current_data_version_over_a_newer_listed_one():
    rows = [row("m/x", "b200_sxm", "sglang", "0.5.14"), row("m/x", "b200_sxm", "sglang", "0.5.16")]
    (c,) = mm.select(mm.read_cells(rows), quick=True, current={("b200_sxm", "sglang"): "0.5.14"})
    assert c["version"] == "0.5.14"
    (c,) = mm.select(mm.read_cells(rows), quick=True)
    assert c["version"] == "0.5.16"


def result(model, family, status, detail, system="h200_sxm"):
    return {"model": model, "family": family, "system": system, "backend": "vllm", "version": "0.24.0",
            "layout": "TP1", "status": status, "detail": detail}


def test_report_is_grouped_sorted_and_counts_models_and_cells():
    results = [
        result("q/b", "Qwen3", "match", "mean_ttft_ms 0 %"),
        result("q/a", "Qwen3", "differs", "kv_tokens 1 % (1 vs 2)", system="b200_sxm"),
        result("q/a", "Qwen3", "match", "mean_ttft_ms 0 %"),
        result("d/v3", "DeepseekV3", "servesim refuses", "no | data"),
    ]
    text = mm.render(results, 0.001)
    assert text == mm.render(list(reversed(results)), 0.001)
    assert text.index("## DeepseekV3") < text.index("## Qwen3")
    assert text.index("| q/a | b200_sxm") < text.index("| q/a | h200_sxm") < text.index("| q/b |")
    assert "no \\| data" in text
    assert "| match | 2 | 2 |" in text and "| differs | 1 | 1 |" in text and "| all | 4 | 3 |" in text
    assert "Models whose every cell matches: 1 of 3." in text
    assert "- d/v3: no \\| data" in text
    assert mm.exit_code(results) == 1
    assert mm.exit_code([r for r in results if r["status"] != "differs"]) == 0
