# Sourced by scripts/test.sh (the README's test command): prepares, once, what the tests need
# beyond Rust, so that the test command passes by itself on a fresh machine. Quiet, and quick,
# when everything is in place already; each step that has to do something says so in one line.
#
#   - .venv: `python3 -m venv` (Debian ships venv apart: python3-venv is installed if missing).
#     The Python suites install their own packages into it from PyPI (scripts/test.sh).
#   - chromium (Debian's package) for the HTML report tests (crates/cli/tests/report_html.rs;
#     $SERVESIM_CHROMIUM names another browser binary).
#   - the reference aisimulate venv for the AIS parity tests: ../shared/parity/setup_aisimulate.sh
#     beside the checkout (about 3 minutes and 1.5 GB the first time), exported as
#     $AISIM_REF_VENV. Without ../shared those tests print a notice and skip.
#   - Dynamo 1.6.1's replay venv (../shared/parity/setup.sh, about a minute the first time),
#     exported as $DYNAMO_REF_VENV: its wheel ships the mocker's own unit tests, which
#     tests/python/test_upstream.py runs against servesim.mocker (skipped without it).
#
# System packages are installed with apt-get (as root, else with sudo). Where that is not
# possible the step prints a notice; the tests that need it then fail or skip with their own
# message naming what is missing.

_servesim_apt() {  # apt-get install -y PACKAGE..., quietly; fails without apt-get or rights
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || return 1
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 || return 1
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"; } >/dev/null 2>&1
}

command -v python3 >/dev/null 2>&1 || { echo "python3 not found (needed for the live and Python suites)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "setup: installing python3-venv" >&2
    _servesim_apt python3-venv || true
  fi
  python3 -m venv .venv || { echo "python3 cannot create a venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi

if [ -z "${SERVESIM_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing chromium (for the HTML report tests)" >&2
  _servesim_apt chromium || echo "notice: could not install chromium; the HTML report tests need it (apt-get install chromium)" >&2
fi

if [ -x ../shared/parity/setup_aisimulate.sh ]; then
  # Idempotent: with a complete venv it installs nothing (a few seconds to check).
  if [ ! -x "${AISIM_REF_VENV:-/tmp/servesim-aisim-ref}/bin/python" ]; then
    echo "setup: installing the reference aisimulate venv (once; about 3 minutes)" >&2
  fi
  if _servesim_py=$(../shared/parity/setup_aisimulate.sh 2>/dev/null); then
    AISIM_REF_VENV="$(cd "$(dirname "$_servesim_py")/.." && pwd)"
    export AISIM_REF_VENV
  else
    echo "notice: could not install aisimulate (../shared/parity/setup_aisimulate.sh); the AIS parity tests will skip" >&2
  fi
  unset _servesim_py
fi
if [ -x ../shared/parity/setup.sh ]; then
  if [ ! -x "${DYNAMO_REF_VENV:-/tmp/servesim-dynamo-ref}/bin/python" ]; then
    echo "setup: installing the reference Dynamo venv (once; about a minute)" >&2
  fi
  if _servesim_py=$(../shared/parity/setup.sh 2>/dev/null); then
    DYNAMO_REF_VENV="$(cd "$(dirname "$_servesim_py")/.." && pwd)"
    export DYNAMO_REF_VENV
  else
    echo "notice: could not install Dynamo (../shared/parity/setup.sh); Dynamo's own mocker tests will skip" >&2
  fi
  unset _servesim_py
fi
unset -f _servesim_apt
