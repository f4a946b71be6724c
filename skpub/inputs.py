"""Reading input streams: a JSON-lines file or a directory of them.

A directory is read in file-name order (files whose names start with ``.`` or
``_`` are skipped, as Spark's file source does); this order is the stream
order of SEMANTICS section 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from skpub.errors import InputError


def input_files(path: str | Path) -> list[Path]:
    """Return the files of an input, in stream order.

    Raises
    ------
    InputError
        If the path does not exist or a directory holds no input file.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise InputError(f"input {p} does not exist")
    files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith((".", "_")))
    if not files:
        raise InputError(f"input directory {p} holds no file")
    return files


def iter_lines(path: str | Path) -> Iterator[str]:
    """Yield every line of the input in stream order, without its line terminator."""
    for f in input_files(path):
        with f.open("r", encoding="utf-8", errors="surrogateescape", newline="") as fh:
            for line in fh:
                yield line.rstrip("\r\n")


def iter_batches(path: str | Path, batch_size: int) -> Iterator[list[str]]:
    """Yield the input's lines in micro-batches of at most ``batch_size`` lines."""
    lines = iter_lines(path)
    while batch := list(islice(lines, batch_size)):
        yield batch
