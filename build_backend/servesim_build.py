"""servesim's PEP 517 build backend: maturin's, after checking that Rust's ``cargo`` is there.

Without ``cargo`` on PATH maturin would download and install a Rust toolchain (about 1 GB, via
puccinialin) into a cache directory without asking. servesim stops instead and says how to
install Rust. Every hook is maturin's own; ``MATURIN_NO_INSTALL_RUST`` keeps maturin from adding
puccinialin to the build requirements should a later hook run without cargo.
"""

import os
import shutil
import sys

os.environ.setdefault("MATURIN_NO_INSTALL_RUST", "1")

import maturin as _maturin  # noqa: E402

NO_CARGO = """\
servesim is built from source with Rust's cargo, which is not on PATH.
Install Rust with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh
(or your system's package: apt-get install cargo), make sure `cargo --version` runs in this shell
(rustup adds ~/.cargo/bin to PATH in new shells), then run pip install again.
"""


def _require_cargo():
    if os.environ.get("CARGO") or shutil.which("cargo"):
        return
    sys.stderr.write(NO_CARGO)
    sys.stderr.flush()
    raise SystemExit(1)


def get_requires_for_build_wheel(config_settings=None):
    _require_cargo()
    return _maturin.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    _require_cargo()
    return _maturin.get_requires_for_build_sdist(config_settings)


if hasattr(_maturin, "get_requires_for_build_editable"):  # PEP 660 (editable installs)

    def get_requires_for_build_editable(config_settings=None):
        _require_cargo()
        return _maturin.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _require_cargo()
    return _maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


if hasattr(_maturin, "prepare_metadata_for_build_editable"):  # PEP 660 (editable installs)

    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        _require_cargo()
        return _maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _require_cargo()
    return _maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


if hasattr(_maturin, "build_editable"):  # PEP 660 (editable installs)

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        _require_cargo()
        return _maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _require_cargo()
    return _maturin.build_sdist(sdist_directory, config_settings)
