"""Append-only, fsync'd logs of lines: the daemon's ingest log, batch journal, commit log and output logs.

A :class:`LineLog` is one file of newline-terminated lines. An entry's
*index* is its line number (0-based). :meth:`LineLog.append` writes whole
lines, flushes and fsyncs before it returns, and only then counts them:
what a caller acknowledges after ``append`` survives ``kill -9`` and power
loss. A crash in the middle of an append leaves a torn last line, which no
one was told about; opening the log again cuts it off (the file is skpub's:
it never touches a file it did not create, :class:`~skpub.kernel.errors.OutputError`).

Reads never see an entry before it is durable: :meth:`read` stops at the
count. Random access by index goes through a sparse index (the byte offset
of every :data:`STRIDE`-th entry), so memory is O(entries / STRIDE) and a
read scans at most ``STRIDE`` lines before its first entry.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from skpub.kernel.errors import OutputError
from skpub.kernel.storage import atomic_write_bytes, own_files

STRIDE = 1024
"""Entries between two offsets kept by the sparse index."""

MAGIC = b'{"skpub_log":1}\n'
"""First line of every log skpub writes: a file without it is not skpub's and is never written to."""

SEGMENT = r"(?:\d{12}|[1-9]\d{12,})"
"""A segment's first entry index in its file name, as ``f"{first:012d}"`` writes it (the 10**12th entry's too)."""


class LineLog:
    """An append-only, fsync'd log of lines (thread-safe: one writer at a time, readers at any time).

    Parameters
    ----------
    path : Path
        The log's file; created with :data:`MAGIC` when missing.

    Raises
    ------
    OutputError
        If ``path`` exists and does not start with :data:`MAGIC` (not skpub's).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        if not self.path.exists():  # whole or not at all: a crash never leaves a header-less file
            atomic_write_bytes(self.path, MAGIC)
        with self.path.open("rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                raise OutputError(f"{self.path} is not a log skpub wrote; it is left as it is")
        self._marks: list[int] = []  # byte offset of entries 0, STRIDE, 2 STRIDE, ...
        self._count = 0
        end = self._scan()
        self._fh = self.path.open("r+b")
        if end < self.path.stat().st_size:  # a torn last line: never acknowledged
            self._fh.truncate(end)
            os.fsync(self._fh.fileno())
        self._fh.seek(end)
        self._end = end

    def _scan(self) -> int:
        """Count the complete lines and build the sparse index; return the byte offset after the last one."""
        pos = len(MAGIC)
        with self.path.open("rb") as fh:
            fh.seek(pos)
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                if self._count % STRIDE == 0:
                    self._marks.append(pos)
                self._count += 1
                pos += len(line)
        return pos

    @property
    def count(self) -> int:
        """Entries durable in the log."""
        return self._count

    def append(self, lines: list[bytes]) -> tuple[int, int]:
        r"""Append ``lines`` (each without ``\n``) durably; return the indexes of the first and the one after the last.

        Raises
        ------
        ValueError
            If a line holds ``\n``.
        OSError
            If the disk refuses the write (full, read-only): nothing is
            counted, and the partial write is cut off before the next append.
        """
        if any(b"\n" in line for line in lines):
            raise ValueError("a log entry may not hold a newline")
        data = b"".join(line + b"\n" for line in lines)
        with self._lock:
            first = self._count
            try:
                self._fh.seek(self._end)
                self._fh.write(data)
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError:
                self._fh.seek(self._end)
                self._fh.truncate(self._end)
                raise
            pos = self._end
            for line in lines:
                if self._count % STRIDE == 0:
                    self._marks.append(pos)
                self._count += 1
                pos += len(line) + 1
            self._end = pos
            self._changed.notify_all()
            return first, self._count

    def read(self, start: int, limit: int) -> list[bytes]:
        """Return up to ``limit`` entries from index ``start`` on (fewer at the end); O(STRIDE + limit)."""
        with self._lock:
            stop = min(self._count, start + max(0, limit))
            if start >= stop or start < 0:
                return []
            mark = start // STRIDE
            pos = self._marks[mark]
        out: list[bytes] = []
        with self.path.open("rb") as fh:
            fh.seek(pos)
            index = mark * STRIDE
            for line in fh:
                if index >= stop:
                    break
                if index >= start:
                    out.append(line[:-1])
                index += 1
        return out

    def byte_offset(self, index: int) -> int:
        """Return the byte offset in the file where entry ``index`` starts (the file's end for ``count``); O(STRIDE).

        Raises
        ------
        IndexError
            If ``index`` is not in ``0 .. count``.
        """
        with self._lock:
            if not 0 <= index <= self._count:
                raise IndexError(f"entry {index} of a log of {self._count}")
            if index == self._count:
                return self._end
            mark = index // STRIDE
            pos = self._marks[mark]
        with self.path.open("rb") as fh:
            fh.seek(pos)
            for _ in range(index - mark * STRIDE):
                pos += len(fh.readline())
        return pos

    def truncate(self, count: int) -> None:
        """Cut the log back to its first ``count`` entries (durably); O(STRIDE).

        Raises
        ------
        IndexError
            If ``count`` is not in ``0 .. count``.
        """
        end = self.byte_offset(count)
        with self._lock:
            self._fh.truncate(end)
            os.fsync(self._fh.fileno())
            self._fh.seek(end)
            self._end, self._count = end, count
            del self._marks[-(-count // STRIDE) :]

    def wait(self, count: int, timeout: float) -> bool:
        """Block until the log holds more than ``count`` entries or ``timeout`` seconds pass; return whether it does."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count > count, timeout)

    def close(self) -> None:
        """Close the file (appends after this fail)."""
        with self._lock:
            self._fh.close()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentedLog:
    """A log kept as segment files: ``<name>-<first index>.log``, each a :class:`LineLog`.

    Entries keep their index for the log's whole life; a segment holds a
    contiguous run of them and is named by its first. Appends go to the
    newest segment, and a new one starts once it holds ``segment_bytes``.
    Old segments go in one of two ways, never the newest: :meth:`retain`
    removes the oldest while the log is over ``retention_bytes`` (the output
    logs: a reader asking for less than :attr:`first` gets 410), and
    :meth:`release` removes those whose entries all lie before an index the
    owner no longer needs (the ingest log behind the checkpoints, the commit
    log behind its base). Only files of this name pattern are touched, each
    checked by its header.

    Raises
    ------
    OutputError
        If a segment is not skpub's, or the segments do not follow each other.
    """

    def __init__(
        self, directory: str | Path, name: str, segment_bytes: int, retention_bytes: int | None = None
    ) -> None:
        self.directory, self.name = Path(directory), name
        self.segment_bytes, self.retention_bytes = segment_bytes, retention_bytes
        pattern = re.compile(rf"{re.escape(name)}-({SEGMENT})\.log", re.ASCII)
        creating = own_files(rf"{re.escape(name)}-{SEGMENT}\.log")
        for path in self.directory.iterdir():  # a segment being created when a kill came: never a log yet
            if path.name.startswith(".") and creating.fullmatch(path.name) and path.is_file():
                path.unlink()
        found = sorted(
            (int(m.group(1)), p) for p in self.directory.iterdir() if (m := pattern.fullmatch(p.name)) and p.is_file()
        )
        self._segments = [(first, LineLog(path)) for first, path in found]
        for (first, log), (following, _) in zip(self._segments, self._segments[1:], strict=False):
            if first + log.count != following:
                raise OutputError(f"{log.path} ends at entry {first + log.count}; the next segment at {following}")
        if not self._segments:
            self._segments = [(0, LineLog(self.path_of(0)))]
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def path_of(self, first: int) -> Path:
        """Return the file of the segment whose first entry is ``first``."""
        return segment_path(self.directory, self.name, first)

    def files(self) -> SegmentFiles:
        """Return the segments' files by first entry (what the Spark engine's tasks read)."""
        return SegmentFiles(self.directory, self.name)

    @property
    def count(self) -> int:
        """Entries ever appended and not cut back (the next entry's index)."""
        first, log = self._segments[-1]
        return first + log.count

    @property
    def first(self) -> int:
        """The earliest index still kept."""
        return self._segments[0][0]

    @property
    def nbytes(self) -> int:
        """Bytes of the segments kept."""
        return sum(log.byte_offset(log.count) for _, log in self._segments)

    def append(self, lines: list[bytes]) -> tuple[int, int]:
        """Append durably as :meth:`LineLog.append` does (to a new segment when the newest is full)."""
        with self._lock:
            first, log = self._segments[-1]
            if log.count and log.byte_offset(log.count) >= self.segment_bytes:
                full, (first, log) = log, (self.count, LineLog(self.path_of(self.count)))  # OSError: still full
                self._segments.append((first, log))
                full.close()
        start, end = log.append(lines)
        with self._changed:
            self._changed.notify_all()
        return first + start, first + end

    def wait(self, count: int, timeout: float) -> bool:
        """Block until the log holds more than ``count`` entries or ``timeout`` seconds pass; return whether it does."""
        with self._changed:
            return self._changed.wait_for(lambda: self.count > count, timeout)

    def _holding(self, index: int) -> tuple[int, LineLog]:
        """Return the segment holding entry ``index`` (the newest for :attr:`count`).

        Raises
        ------
        IndexError
            If ``index`` is before :attr:`first` or past :attr:`count`.
        """
        segments = list(self._segments)
        if not segments[0][0] <= index <= self.count:
            raise IndexError(f"entry {index} of the log {self.name} (entries {self.first} .. {self.count})")
        return next(((f, log) for f, log in reversed(segments) if f <= index), segments[0])

    def segment_end(self, index: int) -> int:
        """Return the index after the last entry of the segment holding ``index`` (:attr:`count` for the newest).

        Raises
        ------
        IndexError
            As :meth:`_holding`.
        """
        first, log = self._holding(index)
        return first + log.count

    def end_position(self, end: int) -> tuple[int, int]:
        """Return ``(segment, byte)``: where entry ``end - 1`` ends, ``segment`` naming its file by its first entry.

        O(:data:`STRIDE`).

        Raises
        ------
        IndexError
            If ``end - 1`` is not an entry kept.
        """
        first, log = self._holding(end - 1)
        return first, log.byte_offset(end - first)

    def read(self, start: int, limit: int) -> list[bytes]:
        """Return up to ``limit`` entries from index ``start`` on ([] from an index no longer kept)."""
        out: list[bytes] = []
        at = start
        for first, log in list(self._segments):
            if at >= first + log.count:
                continue
            if at < first or len(out) >= limit:
                break
            try:
                got = log.read(at - first, limit - len(out))
            except OSError:  # retention removed the segment meanwhile: the caller checks what is kept
                break
            out += got
            at += len(got)
        return out

    def truncate(self, count: int) -> None:
        """Cut the log back to its first ``count`` entries (segments past it removed).

        Raises
        ------
        IndexError
            If ``count`` is past the end or before :attr:`first`.
        """
        if not self.first <= count <= self.count:
            raise IndexError(f"cannot cut the log {self.name} to {count} entries")
        with self._lock:
            while len(self._segments) > 1 and self._segments[-1][0] > count:
                _, log = self._segments.pop()
                log.close()
                log.path.unlink()
            first, log = self._segments[-1]
            log.truncate(count - first)

    def retain(self) -> int:
        """Remove the oldest segments while the log is over its retention; return the earliest index kept."""
        with self._lock:
            while self.retention_bytes is not None and len(self._segments) > 1 and self.nbytes > self.retention_bytes:
                self._drop_oldest()
        return self.first

    def release(self, needed: int) -> int:
        """Remove the oldest segments (never the newest) whose entries all lie before ``needed``.

        Returns the earliest index kept, :attr:`first`.
        """
        with self._lock:
            while len(self._segments) > 1 and self._segments[1][0] <= needed:
                self._drop_oldest()
        return self.first

    def _drop_oldest(self) -> None:
        _, log = self._segments.pop(0)
        log.close()
        log.path.unlink()
        _fsync_dir(self.directory)

    def close(self) -> None:
        """Close every segment."""
        for _, log in self._segments:
            log.close()


def segment_path(directory: Path, name: str, first: int) -> Path:
    """Return the file of log ``name``'s segment whose first entry is ``first`` (:class:`SegmentedLog`)."""
    return Path(directory) / f"{name}-{first:012d}.log"


class SegmentFiles:
    """The files of a :class:`SegmentedLog`, by the first entry of each: ``files[first]`` is a path.

    What the Spark engine's tasks read the daemon's ingest log through
    (:func:`skpub.kernel.slices.slice_lines` indexes its files by a span's
    ``file``, here a segment's first entry); plain data, so it travels to
    executors.
    """

    def __init__(self, directory: str | Path, name: str) -> None:
        self.directory, self.name = str(Path(directory).absolute()), name

    def __getitem__(self, first: int) -> Path:
        return segment_path(Path(self.directory), self.name, first)
