r"""Reading input streams: a JSON-lines file, a directory of them, or standard input.

Lines are read as bytes (SEMANTICS section 1, "Reading lines"): a record ends
at ``\n`` only, one ``\r`` right before it is dropped, a UTF-8 byte-order
mark at the start of a file is skipped, and nothing is decoded here, so a line
that is not UTF-8 reaches the parser as it was and becomes a dead letter.

A directory is read in file-name order; only its ``*.jsonl`` files are input
(names starting with ``.`` or ``_`` are skipped, as Spark's file source does);
every other entry is reported by :func:`skipped_entries` so the run's summary
can name it. This order is the stream order of SEMANTICS section 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from skpub.kernel.errors import InputError

STDIN = "-"
BOM = b"\xef\xbb\xbf"
INPUT_SUFFIX = ".jsonl"


def _is_input(entry: Path) -> bool:
    return entry.is_file() and entry.suffix == INPUT_SUFFIX and not entry.name.startswith((".", "_"))


def input_files(path: str | Path) -> list[Path]:
    """Return the files of an input, in stream order (a path that is not a directory, a pipe say, is one file).

    Raises
    ------
    InputError
        If the path does not exist, or is a directory holding no ``*.jsonl`` file.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"input {p} does not exist")
    if not p.is_dir():
        return [p]
    files = sorted(f for f in p.iterdir() if _is_input(f))
    if not files:
        raise InputError(f"input directory {p} holds no *{INPUT_SUFFIX} file")
    return files


def input_size(path: str | Path) -> int | None:
    """Return the bytes of the input's files, or None for standard input or what is not a regular file (a pipe).

    Raises
    ------
    InputError
        As :func:`input_files`.
    """
    if str(path) == STDIN:
        return None
    files = input_files(path)
    if not all(f.is_file() for f in files):
        return None
    return sum(f.stat().st_size for f in files)


def skipped_entries(path: str | Path) -> list[str]:
    r"""Return the names in an input directory that are not read (not ``*.jsonl``), sorted; [] for a file.

    A name that is not UTF-8 is given with ``\xNN`` escapes, so it can be printed.
    """
    p = Path(path)
    if str(path) == STDIN or not p.is_dir():
        return []
    names = (e.name for e in p.iterdir() if not _is_input(e) and not e.name.startswith((".", "_")))
    return sorted(os.fsencode(name).decode("utf-8", errors="backslashreplace") for name in names)


def read_records(fh: BinaryIO) -> Iterator[bytes]:
    r"""Yield the records of one binary stream: split at ``\n``, one ``\r`` before it dropped, BOM skipped.

    A stream of the mark alone is an empty stream: no record (a request body's
    :func:`skpub.app.api.split_lines` and the Spark source's
    :func:`skpub.kernel.slices.file_sizes` read it so too).
    """
    first = True
    for line in fh:
        if first:
            first = False
            if line == BOM:
                return
            if line.startswith(BOM):
                line = line[len(BOM) :]
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def iter_lines(path: str | Path) -> Iterator[bytes]:
    """Yield every record of the input in stream order, as bytes without the terminator.

    ``path`` is a file, a directory (its ``*.jsonl`` files in name order) or
    ``"-"`` for standard input.

    Raises
    ------
    InputError
        As :func:`input_files`.
    """
    if str(path) == STDIN:
        yield from read_records(sys.stdin.buffer)
        return
    for f in input_files(path):
        with f.open("rb") as fh:
            yield from read_records(fh)


BATCH_BYTES = 512 << 20
"""Most bytes of lines a micro-batch of the embedded engine holds (the Spark engine's cut with two parse tasks)."""


def batches(lines: Iterable[bytes], batch_size: int, max_bytes: int = BATCH_BYTES) -> Iterator[list[bytes]]:
    r"""Group ``lines`` into micro-batches of at most ``batch_size`` lines and about ``max_bytes`` bytes.

    A batch ends at its ``batch_size``-th line or at the line that brings
    its bytes, each line counted with one newline, to ``max_bytes``, so that
    lines of up to ``max_record_bytes`` each (or longer, kept whole for
    their dead letters) never make a batch that memory cannot hold. The
    Spark source's rule (:func:`skpub.kernel.slices.cut`) for lines ended by
    ``\n`` alone; it counts the file's raw bytes, so a ``\r``, a byte-order
    mark or a missing final newline moves its cut by a few bytes, and its
    budget is 256 MiB per parse task. O(1) per line.
    """
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line) + 1
        if len(batch) >= batch_size or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


SAMPLE_BYTES = 64 << 20
"""Most bytes of input kept in memory as the partitioning sample, whatever ``sample_size`` says."""


def take_sample(lines: Iterator[bytes], max_lines: int, max_bytes: int = SAMPLE_BYTES) -> list[bytes]:
    """Take the stream head as the sample of Tornado section 4.1: up to ``max_lines`` lines and ``max_bytes`` bytes.

    The lines taken are consumed from ``lines``; the caller replays them before the rest.
    """
    sample: list[bytes] = []
    size = 0
    for line in lines:
        sample.append(line)
        size += len(line)
        if len(sample) >= max_lines or size >= max_bytes:
            break
    return sample
