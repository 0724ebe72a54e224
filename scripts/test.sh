#!/usr/bin/env bash
# The project's test command (what CI runs): the Rust test suite, then the live server's
# Python suite with real clients (openai SDK, prometheus_client, pyzmq) in a local venv, then
# the Python package (servesim.mocker) built into the same venv and its pytest suite.
# Everything the tests need besides Rust (.venv, chromium, the reference aisimulate venv) is set
# up first by scripts/setup_test_env.sh: quiet and quick when it is in place already.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust (https://rustup.rs), or run .ci/run" >&2; exit 1; }
. scripts/setup_test_env.sh
# crates/python is built once, by maturin below (its pyo3 build differs from a plain cargo
# build, so building it here too would compile it twice).
# Formatting and lints first: cheap, and a failure names the file and line. Skipped with a notice
# when the toolchain has no rustfmt/clippy component.
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "notice: rustfmt not installed; formatting not checked" >&2
fi
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --release --workspace --exclude servesim-python --all-targets -- -D warnings
else
  echo "notice: clippy not installed; lints not checked" >&2
fi
cargo test --release --workspace --exclude servesim-python
# A short bounded fuzz pass over every input reader (scripts/fuzz.sh runs longer ones).
PROPTEST_CASES="${SERVESIM_FUZZ_CASES:-300}" scripts/fuzz.sh
cargo build --release -p servesim
.venv/bin/pip install --quiet --disable-pip-version-check -r tests/live/requirements.txt
.venv/bin/python -m pytest -q tests/live
# servesim.mocker: `maturin develop --release` builds crates/python with the workspace's
# release profile and target dir and installs it into .venv (editable Python sources).
# numpy and pytest-asyncio: Dynamo's own mocker tests import them (tests/python/test_upstream.py).
.venv/bin/pip install --quiet --disable-pip-version-check 'maturin>=1.5,<2' pytest pytest-asyncio numpy
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --release --quiet
.venv/bin/python -m pytest -q tests/python
