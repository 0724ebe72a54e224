"""Reading and writing numpy's ``.npz`` archives without numpy (the mocker's planner profiles
and the profiler's ``raw_data.npz`` tables are small numeric arrays).

Arrays come back as ``(shape, values)`` with the values flattened in C order as Python numbers;
:func:`write_npz` writes float64 arrays the way ``numpy.savez`` does (stored zip members
``<name>.npy``, format 1.0 headers), so ``numpy.load`` and servesim's engine both read them.
"""

from __future__ import annotations

import ast
import os
import struct
import zipfile
from typing import Dict, List, Sequence, Tuple, Union

__all__ = ["NpzError", "npz_member_names", "read_npz", "write_npz"]

_MAGIC = b"\x93NUMPY"
# numpy's dtype codes (without byte order) and their struct formats.
_CODES = {
    "f8": "d", "f4": "f", "f2": "e",
    "i8": "q", "i4": "i", "i2": "h", "i1": "b",
    "u8": "Q", "u4": "I", "u2": "H", "u1": "B",
    "b1": "?",
}


class NpzError(ValueError):
    """An archive or array servesim cannot read."""


def _is_zip(path: Union[str, os.PathLike]) -> bool:
    # numpy.load takes a file for an archive when it starts with a zip header.
    with open(path, "rb") as f:
        head = f.read(4)
    return head in (b"PK\x03\x04", b"PK\x05\x06")


def npz_member_names(path: Union[str, os.PathLike]) -> List[str]:
    """The array names of an archive, as ``numpy.load(path).files`` lists them."""
    if not _is_zip(path):
        raise NpzError(f"{os.fspath(path)}: not an NPZ archive")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise NpzError(f"{os.fspath(path)}: not an NPZ archive ({e})") from e
    return [n[:-4] if n.endswith(".npy") else n for n in names]


def _parse_npy(name: str, data: bytes) -> Tuple[Tuple[int, ...], list]:
    if len(data) < 10 or data[:6] != _MAGIC:
        raise NpzError(f"{name}: not an .npy array")
    major = data[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", data, 8)
        start = 10
    elif major in (2, 3):
        (hlen,) = struct.unpack_from("<I", data, 8)
        start = 12
    else:
        raise NpzError(f"{name}: unsupported .npy version {major}")
    try:
        header = ast.literal_eval(data[start : start + hlen].decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except Exception as e:
        raise NpzError(f"{name}: malformed .npy header") from e
    if not isinstance(descr, str) or descr[1:] not in _CODES:
        raise NpzError(f"{name}: unsupported dtype {descr!r} (expected plain numbers)")
    order = ">" if descr[0] == ">" else "<"
    code = _CODES[descr[1:]]
    count = 1
    for d in shape:
        count *= d
    width = struct.calcsize(code)
    body = data[start + hlen :]
    if len(body) < count * width:
        raise NpzError(f"{name}: holds {len(body)} bytes, shape {shape} needs {count * width}")
    values = list(struct.unpack_from(f"{order}{count}{code}", body))
    if fortran and len(shape) > 1:
        # Column-major storage: index (i0, i1, ...) sits at i0 + d0 * (i1 + d1 * ...).
        out = []
        for flat in range(count):
            idx, rem = [], flat
            for d in reversed(shape):
                idx.append(rem % d)
                rem //= d
            idx.reverse()
            pos, stride = 0, 1
            for i, d in zip(idx, shape):
                pos += i * stride
                stride *= d
            out.append(values[pos])
        values = out
    return shape, values


def read_npz(path: Union[str, os.PathLike]) -> Dict[str, Tuple[Tuple[int, ...], list]]:
    """Every array of an archive: ``{name: (shape, C-order values)}``."""
    names = npz_member_names(path)
    out = {}
    with zipfile.ZipFile(path) as z:
        for member, name in zip(z.namelist(), names):
            out[name] = _parse_npy(member, z.read(member))
    return out


def _npy_bytes(shape: Sequence[int], values: Sequence[float]) -> bytes:
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (%s), }" % dims
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    return _MAGIC + b"\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + struct.pack(
        f"<{len(values)}d", *values
    )


def write_npz(path: Union[str, os.PathLike], arrays: Dict[str, Tuple[Sequence[int], Sequence[float]]]) -> None:
    """Writes ``{name: (shape, C-order values)}`` as float64 arrays, uncompressed."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, (shape, values) in arrays.items():
            z.writestr(name + ".npy", _npy_bytes(shape, [float(v) for v in values]))
