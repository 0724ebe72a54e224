"""The differential fuzzer's verdict on a KV-router case (scripts/difffuzz.py): a range miss on a
continuous metric is resampled before it counts; a count that differs is not. And the rank test
of scripts/router_spread.py."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import difffuzz  # noqa: E402

CASE = {"router_mode": "kv_router"}
P_SHIFT = 0.013313002763816655
P_TIES = 0.0499729998820132


class Stub(difffuzz.Runner):
    """Runs nothing: run k of each side returns the summary `sample(side, k)` gives."""

    def __init__(self, sample, kv_runs=5, kv_confirm=20):
        args = argparse.Namespace(binary="servesim", timeout=1, kv_runs=kv_runs, kv_confirm=kv_confirm,
                                  tolerance=0.005, abs_floor=1e-6, cache_dir=os.devnull)
        self.kv_runs, self.kv_confirm = args.kv_runs, args.kv_confirm
        self.tolerance, self.floor = args.tolerance, args.abs_floor
        self.sample = sample

    def reference(self, case, run=0, timeout=None):
        return {"status": "ok", "summary": self.sample("ref", run), "cached": True}

    def servesim(self, case, report_jsonl=None, router_seed=None):
        return {"status": "ok", "summary": self.sample("ss", router_seed - 42)}


def summary(ttft, completed=10):
    return {"num_requests": 10, "completed_requests": completed, "mean_ttft_ms": ttft}


def test_a_miss_that_more_samples_close_is_a_match():
    # The first 5 runs of each side do not overlap; the 6th reference run reaches servesim's range.
    runner = Stub(lambda side, k: summary(100.0 + k if side == "ss" else 120.0 - (15 if k == 5 else k)))
    res = runner.evaluate(CASE)
    assert res["status"] == "match"
    assert (res["servesim_runs"], res["reference_runs"]) == (20, 20)
    assert res["confirmed_from"].startswith("mean_ttft_ms") and res["confirmed_from"].endswith("with 5 runs")
    assert difffuzz.fmt_worst(res).endswith("resampled after a miss")


def test_a_miss_that_persists_differs_after_resampling():
    runner = Stub(lambda side, k: summary(100.0 if side == "ss" else 120.0))
    res = runner.evaluate(CASE)
    assert res["status"] == "differ" and res["beyond"] == ["mean_ttft_ms"]
    assert res["reference_runs"] == 20 and "confirmed_from" in res


def test_a_count_that_differs_is_not_resampled():
    runner = Stub(lambda side, k: summary(100.0, completed=9 if side == "ss" else 10))
    res = runner.evaluate(CASE)
    assert res["status"] == "differ" and res["reference_runs"] == 5 and "confirmed_from" not in res


def test_confirming_is_off_at_or_below_the_first_sample():
    runner = Stub(lambda side, k: summary(100.0 if side == "ss" else 120.0), kv_confirm=5)
    res = runner.evaluate(CASE)
    assert res["status"] == "differ" and res["reference_runs"] == 5 and "confirmed_from" not in res


def test_router_spread_rank_test_matches_scipy():
    # Values from scipy.stats.mannwhitneyu(a, b, method="asymptotic").pvalue (continuity and ties corrected).
    import router_spread

    assert abs(router_spread.mann_whitney_p([1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 12]) - P_SHIFT) < 1e-12
    assert abs(router_spread.mann_whitney_p([1, 1, 2, 2, 3, 3, 4], [2, 3, 3, 4, 4, 5, 5]) - P_TIES) < 1e-12
    assert router_spread.mann_whitney_p([3, 3], [3, 3]) == 1.0


def test_per_request_records_pair_by_arrival_when_one_side_names_no_sessions():
    # The reference names synthetic sessions; servesim's synthetic records carry none. Pairing
    # by session would call every request missing; arrival order pairs them.
    def record(t, sid=None, turn=None):
        return {"arrival_time_ms": t, "input_length": 544, "requested_output_length": 4,
                "session_id": sid, "turn_index": turn}

    refs = [record(36.6, "session_1", 0), record(0.0, "session_0", 0)]
    ours = [record(0.0), record(36.6)]
    pairs = difffuzz.align(ours, refs)
    assert [(a["arrival_time_ms"], b["session_id"]) for a, b in pairs] == [(0.0, "session_0"), (36.6, "session_1")]
    # Both sides naming sessions pair by them, whatever the arrival order.
    ours = [record(0.0, "session_1", 0), record(36.6, "session_0", 0)]
    pairs = difffuzz.align(ours, refs)
    assert [(a["session_id"], b["session_id"]) for a, b in pairs] == [("session_1", "session_1"), ("session_0", "session_0")]
