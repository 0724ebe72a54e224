"""The PEP 517 backend (build_backend/servesim_build.py): maturin's, but without cargo on PATH
it stops with a message saying how to install Rust instead of letting maturin download a
toolchain (puccinialin)."""

import importlib
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend(monkeypatch):
    pytest.importorskip("maturin")  # scripts/test.sh installs it into .venv
    monkeypatch.syspath_prepend(str(ROOT / "build_backend"))
    monkeypatch.delenv("MATURIN_NO_INSTALL_RUST", raising=False)
    sys.modules.pop("servesim_build", None)
    module = importlib.import_module("servesim_build")
    yield module
    sys.modules.pop("servesim_build", None)


def test_without_cargo_the_build_stops_saying_how_to_install_rust(backend, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cargo there
    monkeypatch.delenv("CARGO", raising=False)
    for hook in ("get_requires_for_build_wheel", "get_requires_for_build_sdist"):
        with pytest.raises(SystemExit) as e:
            getattr(backend, hook)()
        assert e.value.code == 1
        assert capsys.readouterr().err == backend.NO_CARGO
    with pytest.raises(SystemExit):
        backend.build_wheel(str(tmp_path))
    assert "https://rustup.rs" in backend.NO_CARGO
    # maturin is told not to install Rust itself, should it be asked.
    assert os.environ["MATURIN_NO_INSTALL_RUST"] == "1"


def test_with_cargo_the_hooks_are_maturins(backend):
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not on PATH")
    requires = backend.get_requires_for_build_wheel()
    assert isinstance(requires, list)
    assert not any("puccinialin" in r for r in requires)
