"""Speculative decoding on the engine-argument surface, against goldens recorded from Dynamo
1.6.1 with aisimulate 0.13.0 (``goldens/speculation.json``; ``cases.SPEC_*``; recording command
in ``scripts/record_python_goldens.py``): ``aic_nextn`` and its per-position accept rates (the
canonical string the reference stores, its checks in its order and words), ``aic_mtp_seed``, an
AIS timing config's ``nextn`` (taken as the launch's depth, or conflicting with it) and
``speculation`` (only ``ngram`` is a scheme; a valid one is refused by the engine launch, as
the reference refuses it), through ``normalize_mocker_config``, the mocker's flags, and replays
whose numbers (aggregated, two workers, SGLang, TRT-LLM, disaggregated) must agree to 1e-6.
AIS cases skip without the AIS data."""

import json

import pytest

import cases

GOLDEN = json.loads((cases.GOLDENS / "speculation.json").read_text())
CASES = {case_id: (kind, payload) for case_id, kind, payload in cases.speculation_cases()}


def test_every_case_has_a_golden():
    assert sorted(CASES) == sorted(GOLDEN)


@pytest.mark.parametrize("case_id", list(CASES))
def test_speculation_matches_reference(case_id):
    kind, payload = CASES[case_id]
    got = cases.speculation_outcome("servesim", kind, payload)
    if "error" in got and "no AIS performance data found" in got["error"][1]:
        pytest.skip("AIS data not installed (set SERVESIM_AIS_SYSTEMS)")
    want = GOLDEN[case_id]
    assert got.keys() == want.keys(), (got, want)
    if "error" in want:
        assert got == want
    else:
        for key, value in want["ok"].items():
            assert cases.close(got["ok"][key], value), (key, got["ok"][key], value)
