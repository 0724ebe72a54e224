"""servesim.mocker against goldens recorded from Dynamo 1.6.1's dynamo.mocker with the same
calls (scripts/record_python_goldens.py; see README.md here)."""

import json
import os

import pytest

import cases

CALLS = json.loads((cases.GOLDENS / "calls.json").read_text())
REPLAYS = json.loads((cases.GOLDENS / "replays.json").read_text())
HAVE_TRACES = os.path.exists(cases.SYNTHETIC) and os.path.exists(cases.CONVERSATION)
# Call outcomes servesim knowingly does not match, with why.
KNOWN_DIFFERENT = {
    "normalize_bad_7": "the reference renders a hash map here; its key order changes from run to run",
}


def _call_ids(prefix):
    return [case_id for case_id, _ in cases.all_cases() if case_id.startswith(prefix)]


CASES = dict(cases.all_cases())


def _needs_traces(case_id):
    name = CASES[case_id][0]
    return "replay" in name and not HAVE_TRACES


@pytest.mark.parametrize("case_id", list(CASES))
def test_call_matches_reference(case_id):
    if case_id in KNOWN_DIFFERENT:
        pytest.xfail(KNOWN_DIFFERENT[case_id])
    if _needs_traces(case_id):
        pytest.skip(f"traces not found under {cases.TRACES}")
    expected = CALLS[case_id]
    got = cases.outcome("servesim.mocker", CASES[case_id])
    assert got == expected


def test_enough_cases_of_each_kind():
    ok_configs = [k for k, v in CALLS.items() if k.startswith("normalize") and "ok" in v]
    namespaces = [k for k, v in CALLS.items() if k.startswith("argv") and "ok" in v]
    errors = [k for k, v in CALLS.items() if "error" in v]
    assert len(ok_configs) >= 30 and len(namespaces) >= 30 and len(errors) >= 30


_close = cases.close


@pytest.mark.skipif(not HAVE_TRACES, reason="the Mooncake traces are not beside the checkout")
@pytest.mark.parametrize("index", range(len(cases.REPLAYS)))
def test_replay_matches_reference(index):
    expected = REPLAYS[f"replay_{index}"]
    got = cases.replay_outcome("servesim.mocker", cases.REPLAYS[index])
    for key in ("summary_keys", "to_dict_keys", "coverage", "per_request_is_none", "record_keys",
                "routing_history_keys", "admission_history_keys", "num_records"):
        assert got.get(key) == expected.get(key), key
    off = {k: (got["summary"].get(k), v) for k, v in expected["summary"].items() if not _close(got["summary"].get(k), v)}
    assert not off, off
    assert len(got.get("records", [])) == len(expected.get("records", []))
    for i, (g, e) in enumerate(zip(got.get("records", []), expected.get("records", []))):
        assert all(_close(a, b) for a, b in zip(g, e)), (i, g, e)
