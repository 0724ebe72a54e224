"""Dynamo 1.6.1's own unit tests of ``dynamo.mocker`` and ``dynamo.replay.report`` (shipped in
its wheel), run against servesim with the import swapped by ``scripts/upstream_tests.py``; the
tests whose body imports ``dynamo._core`` (Dynamo's native module, not the mocker API) are
deselected there. Skips without the reference venv (``../shared/parity/setup.sh``), numpy or
pytest-asyncio (the upstream tests import them)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upstream_tests.py"
# Upstream tests servesim does not pass yet, with why (none since native host offload landed).
KNOWN_FAILING: set[str] = set()


def test_upstream_unit_tests_pass_on_servesim():
    for module in ("numpy", "pytest_asyncio"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the upstream tests import {module}")
    run = subprocess.run([sys.executable, str(SCRIPT), "-q", "-rf", "-p", "no:warnings"],
                         capture_output=True, text=True, timeout=600)
    if run.returncode == 3:
        pytest.skip(run.stderr.strip())
    out = run.stdout
    failed = set(re.findall(r"^FAILED (\S+)", out, re.M))
    assert failed <= KNOWN_FAILING, out
    passed = int(re.search(r"(\d+) passed", out).group(1))
    deselected = int(re.search(r"(\d+) deselected", out).group(1))
    # Dynamo 1.6.1 ships 32 of them: 5 deselected (dynamo._core), the rest run here.
    assert (passed, deselected, passed + len(failed)) == (32 - 5 - len(failed), 5, 27), out
