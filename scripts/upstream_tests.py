#!/usr/bin/env python3
"""Runs Dynamo 1.6.1's own unit tests of the mocker and the replay report against servesim.

The tests ship inside the reference's wheel (`dynamo/mocker/tests/unit/test_config.py`,
`test_public_cli.py`, `dynamo/replay/tests/test_report.py`). This copies them to a scratch
directory with the import swapped (`dynamo.mocker` -> `servesim.mocker`, `dynamo.replay.report`
-> `servesim.replay`), deselects the tests whose body imports `dynamo._core` itself (they test
Dynamo's native module, not the mocker API), and runs pytest on the copies with this Python:

    scripts/upstream_tests.py [--reference SITE_PACKAGES] [pytest args...]

SITE_PACKAGES is where the reference's `dynamo` package is installed (default: the parity venv
of ../shared/parity/setup.sh, $DYNAMO_REF_VENV or /tmp/servesim-dynamo-ref). The tests need pytest, pytest-asyncio
and numpy. The exit status is pytest's; 3 when the reference's tests are not found.
"""
import ast
import glob
import os
import shutil
import subprocess
import sys
import tempfile

FILES = ["mocker/tests/unit/test_config.py", "mocker/tests/unit/test_public_cli.py", "replay/tests/test_report.py"]
SWAPS = [
    ("dynamo.replay.report", "servesim.replay"),
    ("dynamo.mocker", "servesim.mocker"),
]


def default_site_packages():
    venv = os.environ.get("DYNAMO_REF_VENV", "/tmp/servesim-dynamo-ref")
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    return found[-1] if found else None


def swapped(source):
    for old, new in SWAPS:
        source = source.replace(old, new)
    return source


def core_tests(source):
    """Names of the test functions whose own body imports `dynamo._core`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            if "dynamo._core" in ast.get_source_segment(source, node):
                out.append(node.name)
    return out


def main(argv):
    site = default_site_packages()
    if argv[:1] == ["--reference"]:
        site, argv = argv[1], argv[2:]
    sources = {f: os.path.join(site or "", "dynamo", f) for f in FILES}
    missing = [p for p in sources.values() if not os.path.exists(p)]
    if site is None or missing:
        print(f"Dynamo 1.6.1's tests not found ({missing or 'no reference venv'}); "
              "install the reference with ../shared/parity/setup.sh", file=sys.stderr)
        return 3
    scratch = tempfile.mkdtemp(prefix="servesim-upstream-")
    try:
        deselect = []
        for rel, path in sources.items():
            source = open(path).read()
            name = f"test_{rel.split('/')[0]}_{os.path.basename(rel)[len('test_'):]}"
            open(os.path.join(scratch, name), "w").write(swapped(source))
            deselect += [f"{name}::{t}" for t in core_tests(source)]
        args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict",
                "-o", "asyncio_default_fixture_loop_scope=function", "--rootdir", scratch]
        args += [a for t in deselect for a in ("--deselect", t)]
        print(f"deselected (they import dynamo._core): {', '.join(t.split('::')[1] for t in deselect)}",
              file=sys.stderr)
        return subprocess.call(args + argv + [scratch], cwd=scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
