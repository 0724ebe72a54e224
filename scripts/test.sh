#!/usr/bin/env bash
# The project's test command (what CI runs): the Rust test suite, then the live server's
# Python suite with real clients (openai SDK, prometheus_client, pyzmq) in a local venv.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --workspace
cargo build --release -p servesim
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv || { echo "python3 cannot create a venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r tests/live/requirements.txt
.venv/bin/python -m pytest -q tests/live
