#!/usr/bin/env python3
"""Records the Python API goldens from the reference (Dynamo 1.6.1's dynamo.mocker).

Run with a Python that imports the reference and its helper dependencies (packaging,
pydantic<=2.13.5, uvloop), e.g.

    /tmp/servesim-ref2/bin/python scripts/record_python_goldens.py

(/tmp/servesim-ref2 is a venv whose site-packages has a .pth pointing at the reference venv's
site-packages). Writes tests/python/goldens/{calls,replays,extras}.json; with ``--extras`` only
extras.json (router policy classes and telemetry options, run in a scratch directory); with
``--speculation`` only speculation.json (aic_nextn, its rates and seed, an AIS config's nextn and
draft scheme), which needs aisimulate beside the reference:

    $(../shared/parity/setup_aisimulate.sh --with-dynamo) scripts/record_python_goldens.py --speculation
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import cases  # noqa: E402


def main() -> None:
    import dynamo.mocker  # noqa: F401 - fail early without the reference

    if "--speculation" in sys.argv[1:]:
        import aisimulate_core  # noqa: F401 - the AIS cases need it

        out = {case_id: cases.speculation_outcome("dynamo", kind, payload)
               for case_id, kind, payload in cases.speculation_cases()}
        cases.dump(cases.GOLDENS / "speculation.json", out)
        return

    with tempfile.TemporaryDirectory(prefix="servesim-extras-") as scratch:
        cases.dump(cases.GOLDENS / "extras.json", cases.extras_outcomes("dynamo.mocker", Path(scratch)))
    if "--extras" in sys.argv[1:]:
        return
    calls = {case_id: cases.outcome("dynamo.mocker", case) for case_id, case in cases.all_cases()}
    cases.dump(cases.GOLDENS / "calls.json", calls)
    replays = {}
    for i, case in enumerate(cases.REPLAYS):
        replays[f"replay_{i}"] = cases.replay_outcome("dynamo.mocker", case)
        print(f"replay_{i} done", file=sys.stderr)
    cases.dump(cases.GOLDENS / "replays.json", replays, indent=None)


if __name__ == "__main__":
    main()
