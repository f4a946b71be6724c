r"""An input's micro-batches as byte ranges of its files, read in place (no copy, no whole-file hash).

The Spark engine's source (:mod:`skpub.app.engines.source`) plans each
micro-batch from here: :func:`cut` finds where a batch of at most
``max_lines`` records ends, :func:`split` cuts it into ``parts`` *slices* of
about equal bytes (one parse task each), and :func:`slice_lines` gives a
slice's records, exactly the records :func:`skpub.kernel.inputs.iter_lines`
yields for those bytes (SEMANTICS 1 "Reading lines": a record ends at
``\n``; one ``\r`` before it is dropped; a UTF-8 byte-order mark at the
start of a file is skipped; a last line without ``\n`` is a record).

Offsets are *input positions* ``(file, byte)``: the index of a file in the
input's list and a byte offset in it, always at the start of a record (or a
file's end). Every function reads at most :data:`BLOCK` bytes at a time while
scanning, so memory is bounded by the block plus the records returned.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import orjson

from skpub.kernel.inputs import BOM

BLOCK = 4 << 20
"""Bytes read at a time while scanning for record ends."""

Position = tuple[int, int]
"""An input position: ``(index of the file in the input's list, byte offset in it)``."""


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes ``[start, end)`` of input file ``file`` (an index into the input's list of files)."""

    file: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Slice:
    """Part ``part`` of a micro-batch: its records are the batch's records ``first .. first + lines - 1``.

    ``spans`` are the byte ranges it covers, in stream order (more than one
    when it crosses from one file into the next); ``end`` is the input
    position where the whole micro-batch ends (the same in every slice of
    the batch).
    """

    part: int
    first: int
    lines: int
    spans: tuple[Span, ...]
    end: Position

    def to_json(self) -> bytes:
        """Encode as a JSON document (what travels as the source's row)."""
        return orjson.dumps(
            {
                "part": self.part,
                "first": self.first,
                "lines": self.lines,
                "spans": [[s.file, s.start, s.end] for s in self.spans],
                "end": list(self.end),
            }
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> Slice:
        """Decode :meth:`to_json` output.

        Raises
        ------
        ValueError
            If ``data`` is not such a document.
        """
        try:
            raw = orjson.loads(data)
            spans = tuple(Span(int(f), int(s), int(e)) for f, s, e in raw["spans"])
            end = (int(raw["end"][0]), int(raw["end"][1]))
            return cls(int(raw["part"]), int(raw["first"]), int(raw["lines"]), spans, end)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"not a slice of skpub's source: {exc}") from None


def file_sizes(files: Sequence[Path]) -> list[int]:
    """Return the size in bytes of each input file."""
    return [Path(f).stat().st_size for f in files]


def _blocks(path: Path, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, data)`` blocks of at most :data:`BLOCK` bytes covering ``[start, end)`` of ``path``."""
    with open(path, "rb") as fh:
        fh.seek(start)
        at = start
        while at < end:
            data = fh.read(min(BLOCK, end - at))
            if not data:
                return
            yield at, data
            at += len(data)


def _record_ends(path: Path, start: int, stop: int) -> Iterator[int]:
    """Yield the byte offset just after each record in ``[start, stop)`` of ``path``.

    ``stop`` ends a last record that has no newline.
    """
    tail = False
    for offset, data in _blocks(path, start, stop):
        i = data.find(b"\n")
        while i >= 0:
            yield offset + i + 1
            i = data.find(b"\n", i + 1)
        tail = not data.endswith(b"\n")
    if tail:
        yield stop


def _records(files: Sequence[Path], sizes: Sequence[int], start: Position, end: Position) -> Iterator[Span]:
    """Yield each record from input position ``start`` to ``end`` as the span of its bytes (terminator included)."""
    f, at = start
    while f < len(files) and (f, at) < end:
        stop = sizes[f] if f < end[0] else end[1]
        for record_end in _record_ends(Path(files[f]), at, stop):
            yield Span(f, at, record_end)
            at = record_end
        f, at = f + 1, 0


def _canonical(sizes: Sequence[int], position: Position) -> Position:
    """Return ``position`` moved past file ends (and empty files) to the next file's start.

    The input's end is ``(number of files, 0)``.
    """
    f, at = position
    while f < len(sizes) and at >= sizes[f]:
        f, at = f + 1, 0
    return (f, at) if f < len(sizes) else (len(sizes), 0)


def input_end(sizes: Sequence[int]) -> Position:
    """Return the input position after the last record."""
    return (len(sizes), 0)


def cut(files: Sequence[Path], sizes: Sequence[int], start: Position, max_lines: int, max_bytes: int) -> Position:
    """Return where a micro-batch starting at ``start`` ends: after ``max_lines`` records or ``max_bytes`` bytes.

    ``sizes`` bounds how far it reads (the input as it was when the query
    planned, :func:`file_sizes`). The batch takes whole records only, and
    the record that reaches ``max_bytes`` (so a batch always makes progress).
    Returns ``start`` itself when no record is left. O(bytes of the batch)
    time, O(:data:`BLOCK`) memory.
    """
    lines = taken = 0
    end = start
    for span in _records(files, sizes, start, input_end(sizes)):
        lines, taken = lines + 1, taken + span.end - span.start
        end = (span.file, span.end)
        if lines >= max_lines or taken >= max_bytes:
            break
    return start if lines == 0 else _canonical(sizes, end)


def split(files: Sequence[Path], sizes: Sequence[int], start: Position, end: Position, parts: int) -> list[Slice]:
    """Cut the micro-batch from ``start`` to ``end`` into ``parts`` slices of about equal bytes, in stream order.

    Some slices may hold no record. Each holds at most its share of the
    bytes plus one record. O(records of the batch) memory (their spans).
    """
    records = list(_records(files, sizes, start, end))
    ends = list(accumulate(r.end - r.start for r in records))
    total = ends[-1] if ends else 0
    out, first = [], 0
    for part in range(parts):
        last = bisect_left(ends, total * (part + 1) / parts) + 1 if part < parts - 1 else len(records)
        last = min(max(last, first), len(records))
        out.append(Slice(part, first, last - first, _spans(records[first:last]), end))
        first = last
    return out


def _spans(records: list[Span]) -> tuple[Span, ...]:
    """Merge consecutive records of the same file into one span each."""
    spans: list[Span] = []
    for r in records:
        if spans and spans[-1].file == r.file and spans[-1].end == r.start:
            spans[-1] = Span(r.file, spans[-1].start, r.end)
        else:
            spans.append(r)
    return tuple(spans)


def slice_lines(files: Sequence[Path], piece: Slice) -> list[bytes]:
    """Return the records of ``piece``, as :func:`skpub.kernel.inputs.read_records` gives them.

    Raises
    ------
    ValueError
        If the files no longer hold the records the slice counts (the input changed under the run).
    """
    lines: list[bytes] = []
    for span in piece.spans:
        with open(files[span.file], "rb") as fh:
            fh.seek(span.start)
            data = fh.read(span.end - span.start)
        if len(data) != span.end - span.start:
            raise ValueError(f"input file {files[span.file]} is shorter than when the micro-batch was planned")
        tail = not data.endswith(b"\n")  # the file's last record, without a newline
        if span.start == 0 and data.startswith(BOM):
            data = data[len(BOM) :]
        records = data.split(b"\n")
        last = records.pop()
        lines += [r[:-1] if r.endswith(b"\r") else r for r in records]
        if tail:
            lines.append(last)
    if len(lines) != piece.lines:
        raise ValueError(f"slice {piece.part} holds {len(lines)} records where {piece.lines} were planned")
    return lines
