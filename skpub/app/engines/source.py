"""The Spark engine's streaming source: the input read in place through PySpark's Python data source API.

``spark.readStream.format("skpub_lines")`` (:class:`LineSource`) is a
micro-batch source whose offsets are input positions
(:data:`skpub.kernel.slices.Position`, as ``{"file", "byte"}``): a
micro-batch is at most ``batch_size`` records (or ``max_bytes`` bytes) from
where the last one ended, planned on the driver by
:func:`skpub.kernel.slices.cut` and cut into ``parts`` slices
(:func:`~skpub.kernel.slices.split`), one row each. A row is the slice's
JSON, never its records: the parse task reads the records from the input
files itself (:func:`~skpub.kernel.slices.slice_lines`), so the bytes cross
no JVM and the input is neither copied nor hashed whole. Spark's offset
log holds every batch's start and end before it runs, so a replayed batch
gets the same slices.

Options: ``files`` (a JSON list of absolute paths, in stream order, on a
file system every executor sees), ``batch_size``, ``max_bytes``, ``parts``.
The input must not change during a run (``slice_lines`` refuses a slice
whose bytes no longer hold the records planned). ``Trigger.AvailableNow``
reads up to the input's end as it was when the query started.

With the option ``journal`` (the daemon's batch journal,
:class:`skpub.app.daemon.Daemon`) the input is the daemon's ingest log and
the micro-batches are the journal's entries, one per trigger, in order.
Both are logs in segments (:class:`skpub.app.journal.SegmentedLog`; the
options ``journal`` and ``segments`` are ``[directory, name]`` of each,
:class:`skpub.app.journal.SegmentFiles`): the offset's ``file`` names an
ingest segment by its first entry (release removes old segments, so a list
index would shift), and it adds ``batch`` (entries taken) and ``journal``
(the byte where the next entry starts, in the journal segment whose first
entry is ``journal_segment``; the next segment's start once the journal
rolled). A micro-batch starts only once its entry is complete in the
journal, which the daemon writes after the lines are durable; a batch never
crosses ingest segments (the daemon cuts it at a segment's end). Spark's
batch ids then equal the journal's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from skpub.app.journal import MAGIC, SegmentFiles
from skpub.kernel.slices import Position, Slice, Span, cut, file_sizes, split

SOURCE_NAME = "skpub_lines"
SLICE_SCHEMA = "slice string"
"""One row per slice: its JSON (:meth:`skpub.kernel.slices.Slice.to_json`)."""


def _offset(position: Position) -> dict:
    return {"file": position[0], "byte": position[1]}


def _position(offset: dict) -> Position:
    return int(offset["file"]), int(offset["byte"])


class SliceInput(InputPartition):
    """One slice of a micro-batch, as its JSON."""

    def __init__(self, value: str) -> None:
        super().__init__(value)


class LineReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches of the input files (see the module's docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.files = [Path(f) for f in orjson.loads(options.get("files", "[]"))]
        self.batch_size = int(options["batch_size"])
        self.max_bytes = int(options["max_bytes"])
        self.parts = int(options["parts"])
        self.journal = SegmentFiles(*orjson.loads(options["journal"])) if options.get("journal") else None
        self.segments = SegmentFiles(*orjson.loads(options["segments"])) if self.journal is not None else None
        self.sizes: list[int] | None = None  # the input's end for Trigger.AvailableNow

    def initialOffset(self) -> dict:
        """Return the input's start (after the logs' header with a journal)."""
        if self.journal is None:
            return _offset((0, 0))
        return {**_offset((0, len(MAGIC))), "batch": 0, "journal": len(MAGIC), "journal_segment": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """Return ``batch_size`` records."""
        return ReadMaxRows(self.batch_size)

    def prepareForTriggerAvailableNow(self) -> None:
        """Note the input's end now: ``Trigger.AvailableNow`` reads no further."""
        self.sizes = file_sizes(self.files)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Return where the micro-batch from ``start`` ends; ``start`` itself when no record is left."""
        if self.journal is not None:
            return self._journaled(start)
        rows = self.batch_size if isinstance(limit, ReadAllAvailable) else min(limit.max_rows, self.batch_size)
        sizes = self.sizes if self.sizes is not None else file_sizes(self.files)
        end = cut(self.files, sizes, _position(start), rows, self.max_bytes)
        return _offset(end) if end != _position(start) else start

    def _journaled(self, start: dict) -> dict:
        """Return the end of the journal's next entry after ``start``, or ``start`` while it is not complete.

        Raises
        ------
        ValueError
            If the entry does not name the batch that follows ``start``.
        """
        batch, segment, byte = int(start["batch"]), int(start.get("journal_segment", 0)), int(start["journal"])
        line = _line_at(self.journal[segment], byte)
        if not line and self.journal[batch].exists():  # the journal rolled: the entry starts the next segment
            segment, byte = batch, len(MAGIC)
            line = _line_at(self.journal[segment], byte)
        if line is None:
            raise ValueError(
                f"the batch journal no longer keeps batch {batch} ({self.journal[segment]} is gone): this Spark "
                "checkpoint is older than what the daemon kept (was the data directory run with --engine local?)"
            )
        if not line.endswith(b"\n"):
            return start
        entry = orjson.loads(line)
        if int(entry["batch"]) != batch:
            raise ValueError(f"{self.journal[segment]}: entry of batch {entry['batch']} where {batch} was expected")
        return {
            **_offset((int(entry.get("segment", 0)), int(entry["byte"]))),
            "batch": batch + 1,
            "journal": byte + len(line),
            "journal_segment": segment,
        }

    def partitions(self, start: dict, end: dict) -> list[SliceInput]:
        """Return the ``parts`` slices of the micro-batch from ``start`` to ``end`` (none when they are equal)."""
        first, last = _position(start), _position(end)
        if first == last:
            return []
        if self.segments is not None:
            return [SliceInput(s.to_json().decode()) for s in self._segment_slices(first, last)]
        sizes = file_sizes(self.files)
        return [SliceInput(s.to_json().decode()) for s in split(self.files, sizes, first, last, self.parts)]

    def _segment_slices(self, start: Position, end: Position) -> list[Slice]:
        """Return a journaled batch's slices, all in ``end``'s segment.

        The batch starts at that segment's first entry when ``start`` lies
        in an earlier segment; the spans' ``file`` is the segment's first entry.
        """
        segment, stop = end
        begin = start[1] if start[0] == segment else len(MAGIC)
        planned = split([self.segments[segment]], [stop], (0, begin), (0, stop), self.parts)
        return [
            replace(s, spans=tuple(Span(segment, span.start, span.end) for span in s.spans), end=end) for s in planned
        ]

    def read(self, partition: SliceInput) -> Iterator[tuple[str]]:
        """Yield the slice's row (runs on an executor)."""
        yield (partition.value,)


def _line_at(path: Path, byte: int) -> bytes | None:
    """Return the line of ``path`` from ``byte`` (b"" at its end, None when the file is gone; no newline if torn)."""
    try:
        with path.open("rb") as fh:
            fh.seek(byte)
            return fh.readline(1 << 16)
    except FileNotFoundError:
        return None


class LineSource(DataSource):
    """``spark.readStream.format("skpub_lines")``: the input's records, planned as slices (module docstring)."""

    @classmethod
    def name(cls) -> str:
        """Return the format name, :data:`SOURCE_NAME`."""
        return SOURCE_NAME

    def schema(self) -> str:
        """Return :data:`SLICE_SCHEMA`."""
        return SLICE_SCHEMA

    def streamReader(self, schema) -> LineReader:  # noqa: ANN001 - pyspark's StructType
        """Return the reader of the options' input."""
        return LineReader(self.options)
