"""Atomic file writes: a temporary name in the same directory, then a rename.

Every file that a replayed micro-batch may write again (sink parts, router
state, routing epochs) goes through here, so a reader never sees half a file
and a replay replaces the first attempt whole.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def _process_umask() -> int:
    """Return the process's umask, read once at import (setting it to read it races with other threads)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


_UMASK = _process_umask()


BATCH = r"(?:\d{8}|[1-9]\d{8,})"
"""A micro-batch id in a file name, as ``f"{batch:08d}"`` writes it: eight digits, or more without a leading zero.

A long-running daemon passes batch 99,999,999; its later names have nine
digits and are skpub's too, while ``000000001`` is not a name skpub writes.
"""


def own_files(pattern: str) -> re.Pattern[str]:
    """Return a regex matching file names of ``pattern`` and their temporary names while being written.

    skpub recognizes its own files by name: ``pattern`` itself, or
    ``.<name>.<random>.tmp`` as :func:`atomic_write_bytes` leaves it when a
    run is killed mid-write. ``pattern`` appears once in the regex, so its
    named groups (such as ``(?P<batch>...)``) are found in either; the group
    ``temporary`` (group 1: the pattern's own positional groups start at 2;
    a pattern must not name a group ``temporary``) is set in a temporary
    name only. Digits are ASCII digits only (``re.ASCII``).
    """
    return re.compile(rf"(?P<temporary>\.)?(?:{pattern})(?(temporary)\.[A-Za-z0-9_]+\.tmp)", re.ASCII)


def entries(directory: Path) -> list[tuple[Path, str]]:
    """Return the entries of ``directory`` with their kind, never following links.

    Returns
    -------
    list of (Path, str)
        Kind ``file``, ``dir``, ``link`` (a symbolic link, whatever it points
        to) or ``other``; sorted by name.
    """
    out = []
    for entry in sorted(directory.iterdir()):
        if entry.is_symlink():
            kind = "link"
        elif entry.is_dir():
            kind = "dir"
        elif entry.is_file():
            kind = "file"
        else:
            kind = "other"
        out.append((entry, kind))
    return out


def atomic_write_bytes(path: str | Path, data: bytes | bytearray | memoryview | list[bytes | memoryview]) -> None:
    """Write ``data`` (bytes, or buffers in order) to ``path`` atomically and durably.

    The file is fsync'd before the rename, the directory after it.

    What skpub commits (sink parts, checkpoint files, epochs) survives a
    machine crash whole or not at all, never as a renamed empty file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as fh:
            for buffer in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                fh.write(buffer)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically as UTF-8.

    Raises
    ------
    UnicodeEncodeError
        If ``text`` holds a lone surrogate: skpub never writes invalid UTF-8.
    """
    atomic_write_bytes(path, text.encode("utf-8"))
