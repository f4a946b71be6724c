"""A quiet console: the engine's own log lines go to a file, skpub's progress stays on the terminal.

Spark's JVM and its Python workers are child processes that write to the
standard output and error they inherit. :func:`engine_log` points this
process's file descriptors 1 and 2 at a log file in the output directory
before Spark starts, so every child inherits the file; skpub's progress
lines go to a duplicate of the terminal taken before the switch. The
descriptors are restored when the block ends (the JVM keeps the file).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from skpub.app.output import ENGINE_LOG
from skpub.app.summary import RunObserver


@contextmanager
def engine_log(output: Path, observer: RunObserver) -> Iterator[Path]:
    """Send fds 1 and 2 (and so Spark's and its workers' lines) to ``output/_engine.log`` for the block.

    The observer's progress stream, when it writes to fd 1 or 2, is moved to
    a copy of the terminal for the block. The log is appended to, one header
    line per run. The JVM inherits the descriptors when it starts: a second
    Spark run in the same process reuses that JVM, whose lines keep going to
    the first run's log.

    Raises
    ------
    OSError
        If the log file cannot be opened (the descriptors are left as they were).
    """
    output.mkdir(parents=True, exist_ok=True)
    path = output / ENGINE_LOG
    with lines_to_file(path, "skpub run") as terminal:
        progress = observer.stream
        if _is_terminal_fd(progress):
            observer.stream = terminal
        try:
            yield path
        finally:
            observer.close()  # before the terminal copy it draws on is closed
            observer.stream = progress


@contextmanager
def lines_to_file(path: Path, header: str) -> Iterator[TextIO]:
    """Point fds 1 and 2 at the file ``path`` (appended to, after a header line) for the block.

    Yields a text stream to what fd 2 was (the terminal), for skpub's own
    lines; the descriptors are restored when the block ends.

    Raises
    ------
    OSError
        If the file cannot be opened (the descriptors are left as they were).
    """
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(log, f"==== {header}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')} ====\n".encode())
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
        terminal.close()


def _is_terminal_fd(stream: object) -> bool:
    """Whether ``stream`` writes to this process's fd 1 or 2 (the descriptors being redirected)."""
    try:
        return stream is not None and stream.fileno() in (1, 2)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
