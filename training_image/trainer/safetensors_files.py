"""Reading safetensors tensors into existing FP32 tensors with plain file reads.

``safe_open(...).get_tensor`` hands out tensors over a memory map of the file; copying one into a
fresh FP32 parameter faults in every 4 KiB page of the map and converts from there. Reading the
bytes with ``readinto`` into a small staging buffer that stays in the CPU's cache, and converting
from it, costs a fraction of that (on the bench's CPU, 0.05 s instead of 0.23 to 0.41 s for
310 MB a page cache holds). FP32 tensors are read straight into their destination.

The layout read here is the safetensors format (huggingface/safetensors README, "Format"): an
unsigned little-endian 64-bit header size N, N bytes of a JSON object naming each tensor's
``dtype``, ``shape`` and ``data_offsets`` (begin, end) relative to the byte buffer that follows
the header, and an optional ``__metadata__`` entry. The caller opens every file with
``safe_open`` first, which validates that header (offsets inside the buffer, the buffer exactly
covered), and keeps the handle for the dtypes this module does not read itself.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# The safetensors dtypes read with file reads: the floating-point ones that convert exactly or
# widen to FP32 (any other goes through safe_open's tensor).
READ_DTYPES: Mapping[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}
# Bytes read and converted at a time: a multiple of every READ_DTYPES item size, small enough to
# stay in a core's share of the last-level cache between the read and the conversion.
STAGING_BYTES = 4 << 20
HEADER_SIZE_BYTES = 8


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: its dtype name, shape and byte range in the file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Piece:
    """Tensor ``name`` of ``path``, to be written into ``dest`` (contiguous, FP32, its shape)."""

    path: Path
    name: str
    dest: torch.Tensor


def header(path: Path) -> dict[str, Entry]:
    """The tensors of safetensors file ``path`` by name, with absolute byte offsets. Expects a
    file ``safe_open`` has accepted (see the module docstring)."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(HEADER_SIZE_BYTES), "little")
        raw = json.loads(f.read(size))
    start = HEADER_SIZE_BYTES + size
    return {
        name: Entry(
            dtype=str(info["dtype"]),
            shape=tuple(int(d) for d in info["shape"]),
            begin=start + int(info["data_offsets"][0]),
            end=start + int(info["data_offsets"][1]),
        )
        for name, info in raw.items()
        if name != "__metadata__"
    }


def fill(
    pieces: Sequence[Piece],
    headers: Mapping[Path, Mapping[str, Entry]],
    handles: Mapping[Path, Any],
) -> None:
    """Writes each piece's tensor into its ``dest``, converted to FP32 as ``Tensor.copy_``
    converts, reading each file once in offset order. ``handles`` holds an open ``safe_open``
    handle per file, used for dtypes outside :data:`READ_DTYPES`.

    Raises:
        OSError: a file cannot be read, or ends before a tensor's last byte.
    """
    staging = torch.empty(STAGING_BYTES, dtype=torch.uint8)
    ordered = sorted(pieces, key=lambda p: (p.path, headers[p.path][p.name].begin))
    with _one_intra_op_thread():
        for path, group in itertools.groupby(ordered, key=lambda p: p.path):
            with path.open("rb", buffering=0) as f:
                for piece in group:
                    entry = headers[path][piece.name]
                    if entry.dtype in READ_DTYPES:
                        _read_into(f, entry, piece.dest, staging)
                    else:
                        piece.dest.copy_(handles[path].get_tensor(piece.name))


def _read_into(f: io.FileIO, entry: Entry, dest: torch.Tensor, staging: torch.Tensor) -> None:
    f.seek(entry.begin)
    flat = dest.view(-1)
    size = entry.end - entry.begin
    dtype = READ_DTYPES[entry.dtype]
    if dtype == torch.float32:
        _read_exact(f, flat.view(torch.uint8), size)
        return
    item = dtype.itemsize
    for done in range(0, size, STAGING_BYTES):
        n = min(STAGING_BYTES, size - done)
        _read_exact(f, staging, n)
        flat[done // item : (done + n) // item].copy_(staging[:n].view(dtype))


def _read_exact(f: io.FileIO, into: torch.Tensor, size: int) -> None:
    """Fills the first ``size`` bytes of the uint8 tensor ``into`` from ``f``."""
    view = into.numpy().data[:size]
    got = 0
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            raise OSError(f"{f.name}: ends {size - got} bytes before the tensor it holds")
        got += n


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """torch's intra-op threads set to one, then restored. Each conversion is a short,
    memory-bound parallel region that ends at a barrier waiting for its slowest thread; with
    other work on the cores every barrier costs a scheduler slice (74 copies of 2 M elements:
    0.16 s on one thread, 0.80 s on two, on the bench's 2-core machine at load 7)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
