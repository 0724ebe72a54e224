"""Planner-profiler results directories converted to the mocker's NPZ profile, against what
Dynamo 1.6.1's converter makes of the same directories (tests/python/data/profiler/golden.json,
recorded with `$(../shared/parity/setup_aisimulate.sh --with-dynamo)
tests/python/data/profiler/record.py`), and `--planner-profile-data` resolving them."""

import gc
import json
import shutil
import sys
from pathlib import Path

import pytest

from servesim.mocker.args import resolve_planner_profile_data
from servesim.mocker.config import normalize_mocker_config
from servesim.mocker.utils import planner_profiler_perf_data_converter as conv
from servesim.mocker.utils._npz import read_npz, write_npz
from servesim.replay import run_synthetic_trace_replay

DATA = Path(__file__).parent / "data" / "profiler"
GOLDEN = json.loads((DATA / "golden.json").read_text())


def _flat(v):
    return [x for row in v for x in row] if v and isinstance(v[0], list) else v


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_conversion_matches_the_reference(key, tmp_path):
    name, resolution = key.split("@")
    want = GOLDEN[key]
    out = tmp_path / "perf_data.npz"
    if "error" in want:
        with pytest.raises({"RuntimeError": RuntimeError, "FileNotFoundError": FileNotFoundError}[want["error"]]) as e:
            conv.convert_profile_results_to_npz(DATA / name, out, int(resolution))
        assert str(e.value) == want["message"]
        assert not out.exists()
        return
    assert conv.convert_profile_results_to_npz(DATA / name, out, int(resolution)) == out
    got = read_npz(out)
    assert list(got) == list(conv.MOCKER_NPZ_KEYS)
    r = int(resolution)
    assert got["decode_itl"][0] == (r, r)
    for k, v in want.items():
        if k == "decode_itl" and isinstance(v, dict):  # rows of the 100 x 100 table
            pairs = [(got[k][1][int(i) * r + j], x) for i, row in v.items() for j, x in enumerate(row)]
        else:
            assert got[k][0] == ((r,) if k != "decode_itl" else (r, r))
            assert len(got[k][1]) == len(_flat(v))
            pairs = list(zip(got[k][1], _flat(v)))
        for ours, ref in pairs:
            assert ours == pytest.approx(ref, rel=1e-12, abs=1e-12), (k, ours, ref)


def test_the_engine_times_a_converted_profile(tmp_path):
    out = tmp_path / "perf_data.npz"
    conv.convert_profile_results_to_npz(DATA / "json_dir", out, 7)
    timing = {"type": "external", "provider": "dynamo_profile", "config": {"path": str(out)}}
    cfg = normalize_mocker_config({"engine": {"timing_model": timing}})
    assert cfg["engine"]["timing_model"] == timing
    report = run_synthetic_trace_replay(1024, 1, 1, extra_engine_args=cfg, arrival_interval_ms=10)
    # One request of 1024 new tokens: the prefill table, interpolated linearly.
    isl, ttft = read_npz(out)["prefill_isl"][1], read_npz(out)["prefill_ttft_ms"][1]
    i = next(k for k in range(len(isl) - 1) if isl[k] <= 1024 <= isl[k + 1])
    want = ttft[i] + (ttft[i + 1] - ttft[i]) * (1024 - isl[i]) / (isl[i + 1] - isl[i])
    assert report.summary["mean_ttft_ms"] == pytest.approx(want, abs=1e-6)


def test_resolving_a_profiler_directory_converts_it_into_a_temporary_directory():
    result = resolve_planner_profile_data(planner_profile_data=DATA / "npz_dir")
    npz = result.npz_path
    assert npz.name == "perf_data.npz" and npz.parent.name.startswith("mocker_perf_data_")
    assert conv.is_mocker_format_npz(npz)
    assert read_npz(npz)["prefill_isl"][0] == (100,)
    del result
    gc.collect()
    assert not npz.parent.exists()


def test_a_directory_whose_fit_fails_raises_the_reference_error():
    with pytest.raises(RuntimeError, match="^Failed to fit prefill regression from profiling data$"):
        resolve_planner_profile_data(DATA / "neg_prefill")


def test_mocker_npz_recognition_needs_no_numpy(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` raises ImportError
    good = tmp_path / "profile.npz"
    write_npz(good, {k: ((2,), [1.0, 2.0]) for k in conv.MOCKER_NPZ_KEYS})
    assert resolve_planner_profile_data(good).npz_path == good
    partial = tmp_path / "partial.npz"
    write_npz(partial, {"prefill_isl": ((2,), [1.0, 2.0])})
    renamed = tmp_path / "profile.zip"
    shutil.copy(good, renamed)
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not an archive")
    for p in (partial, renamed, garbage, tmp_path):
        assert not conv.is_mocker_format_npz(p)
        with pytest.raises(FileNotFoundError, match="is neither a mocker-format NPZ file"):
            resolve_planner_profile_data(p)


def test_output_names_and_the_command_line(tmp_path):
    # numpy.savez appends `.npz` to a name without it; the function returns the name given.
    bare = tmp_path / "perf"
    assert conv.convert_profile_results_to_npz(DATA / "one_point", bare, 3) == bare
    assert (tmp_path / "perf.npz").is_file() and not bare.exists()
    out_dir = tmp_path / "made" / "here"
    conv.main(["--profile_results_dir", str(DATA / "one_point"), "--resolution", "4", "--output_dir", str(out_dir)])
    assert read_npz(out_dir / "perf_data.npz")["decode_itl"][0] == (4, 4)


def test_npz_reader_handles_numpy_layouts(tmp_path):
    import struct
    import zipfile

    def npy(descr, fortran, shape, body):
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
        header += " " * (-(12 + len(header) + 1) % 64) + "\n"
        return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header.encode() + body

    path = tmp_path / "a.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        # [[1, 2, 3], [4, 5, 6]] stored column by column, big-endian 4-byte floats.
        z.writestr("f.npy", npy(">f4", True, "(2, 3)", struct.pack(">6f", 1, 4, 2, 5, 3, 6)))
        z.writestr("i.npy", npy("<i8", False, "(2,)", struct.pack("<2q", -7, 9)))
        z.writestr("o.npy", npy("|O", False, "(1,)", b""))
    arrays = {}
    with zipfile.ZipFile(path) as z:
        from servesim.mocker.utils._npz import _parse_npy

        arrays = {n: _parse_npy(n, z.read(n)) for n in ("f.npy", "i.npy")}
        with pytest.raises(ValueError, match="unsupported dtype '|O'"):
            _parse_npy("o.npy", z.read("o.npy"))
    assert arrays["f.npy"] == ((2, 3), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert arrays["i.npy"] == ((2,), [-7, 9])
