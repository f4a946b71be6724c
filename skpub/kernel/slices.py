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
    """Return the size in bytes of each input file, 0 for one that holds no record.

    A file of a byte-order mark alone holds no record (the mark is skipped,
    SEMANTICS section 1, and what is left is an empty file): its size is 0,
    so no micro-batch reads it, as :func:`~skpub.kernel.inputs.read_records`
    yields nothing for it.
    """
    sizes = [Path(f).stat().st_size for f in files]
    return [0 if _bom_only(Path(f), size) else size for f, size in zip(files, sizes, strict=True)]


def _bom_only(path: Path, size: int) -> bool:
    """Return whether the file of ``size`` bytes holds a byte-order mark and nothing else."""
    if size != len(BOM):
        return False
    with open(path, "rb") as fh:
        return fh.read(len(BOM) + 1) == BOM


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


def _ends_with_newline(path: Path, size: int) -> bool:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


def _nth_newline(data: bytes, n: int) -> int:
    """Return the index of the ``n``-th newline of ``data`` (1-based; there are at least ``n``)."""
    i = -1
    for _ in range(n):
        i = data.index(b"\n", i + 1)
    return i


def cut(files: Sequence[Path], sizes: Sequence[int], start: Position, max_lines: int, max_bytes: int) -> Position:
    """Return where a micro-batch starting at ``start`` ends: after ``max_lines`` records or ``max_bytes`` bytes.

    ``sizes`` bounds how far it reads (the input as it was when the query
    planned, :func:`file_sizes`). The batch takes whole records only, and
    the record that reaches ``max_bytes`` (so a batch always makes progress).
    Returns ``start`` itself when no record is left. O(bytes of the batch)
    time in C (newlines are counted per block, found one by one only in the
    block where the batch ends), O(:data:`BLOCK`) memory.
    """
    lines = taken = 0
    f, at = start
    while f < len(files):
        size, tail = sizes[f], False
        for offset, data in _blocks(Path(files[f]), at, size):
            count = data.count(b"\n")
            ends = []
            if lines + count >= max_lines:
                ends.append(_nth_newline(data, max_lines - lines))
            if taken + len(data) >= max_bytes and (i := data.find(b"\n", max(0, max_bytes - taken - 1))) >= 0:
                ends.append(i)
            if ends:
                return _canonical(sizes, (f, offset + min(ends) + 1))
            lines, taken, tail = lines + count, taken + len(data), not data.endswith(b"\n")
        if tail:  # the file's last record has no newline
            lines += 1
            if lines >= max_lines or taken >= max_bytes:
                return _canonical(sizes, (f, size))
        f, at = f + 1, 0
    return start if lines == 0 else input_end(sizes)


def _ranges(sizes: Sequence[int], start: Position, end: Position) -> list[Span]:
    """Return the byte ranges, one per file, from input position ``start`` to ``end`` (none empty)."""
    out, (f, at) = [], start
    while f < len(sizes) and (f, at) < end:
        stop = sizes[f] if f < end[0] else end[1]
        if stop > at:
            out.append(Span(f, at, stop))
        f, at = f + 1, 0
    return out


def _count_records(files: Sequence[Path], sizes: Sequence[int], span: Span) -> int:
    """Return the records in ``span`` (it starts at a record and ends at one's end or at its file's end)."""
    count = sum(data.count(b"\n") for _, data in _blocks(Path(files[span.file]), span.start, span.end))
    at_end = span.end == sizes[span.file]
    return count + (1 if at_end and not _ends_with_newline(Path(files[span.file]), span.end) else 0)


def _record_end_from(files: Sequence[Path], ranges: list[Span], k: int, local: int) -> int:
    """Return the first record end at or after byte ``local`` of range ``k`` (a position in that range's file)."""
    span = ranges[k]
    at = max(span.start, local - 1)
    for offset, data in _blocks(Path(files[span.file]), at, span.end):
        i = data.find(b"\n")
        if i >= 0:
            return offset + i + 1
    return span.end


def split(files: Sequence[Path], sizes: Sequence[int], start: Position, end: Position, parts: int) -> list[Slice]:
    """Cut the micro-batch from ``start`` to ``end`` into ``parts`` slices of about equal bytes, in stream order.

    Slice ``k`` ends at the first record end at or after ``(k + 1) / parts``
    of the batch's bytes (some slices may hold no record; each holds at most
    its share of the bytes plus one record). O(bytes of the batch) time in
    C, O(:data:`BLOCK`) memory.
    """
    ranges = _ranges(sizes, start, end)
    before = list(accumulate((r.end - r.start for r in ranges), initial=0))  # batch bytes before each range
    total = before[-1]
    cuts: list[tuple[int, int]] = []  # (range index, byte in its file) where each slice ends
    for part in range(parts):
        if part == parts - 1 or not ranges:
            cuts.append((len(ranges) - 1, ranges[-1].end) if ranges else (0, 0))
            continue
        target = -(-total * (part + 1) // parts)  # the slice ends at the first record end at or after this
        k = bisect_left(before, target) - 1  # the range holding the target's last byte
        point = (k, _record_end_from(files, ranges, k, ranges[k].start + target - before[k]))
        cuts.append(max(point, cuts[-1]) if cuts else point)
    out, first, at = [], 0, (0, ranges[0].start if ranges else 0)
    for part, (k, byte) in enumerate(cuts):
        spans = []
        for j in range(at[0], k + 1) if ranges else ():
            lo = at[1] if j == at[0] else ranges[j].start
            hi = byte if j == k else ranges[j].end
            if hi > lo:
                spans.append(Span(ranges[j].file, lo, hi))
        lines = sum(_count_records(files, sizes, span) for span in spans)
        out.append(Slice(part, first, lines, tuple(spans), end))
        first += lines
        at = (k, byte)
    return out


def slice_lines(files: Sequence[Path], piece: Slice, entries: bool = False) -> list[bytes]:
    """Return the records of ``piece``, as :func:`skpub.kernel.inputs.read_records` gives them.

    ``files[span.file]`` is each span's file (any indexable: the daemon's
    ingest segments are indexed by their first entry). With ``entries`` the
    files are logs of entries that are records as they are (the daemon's
    ingest log, :class:`skpub.app.journal.SegmentedLog`): split at newlines
    only, nothing dropped.

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
        if entries:
            lines += data.split(b"\n")[:-1] if not tail else data.split(b"\n")
            continue
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
