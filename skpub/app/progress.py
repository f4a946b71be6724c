"""Progress of a long command: a live bar on a terminal (rich), plain lines otherwise.

``skpub run`` counts input bytes read of the input's size (records,
objects/s and the ETA beside), ``skpub simulate`` runs done of the runs
planned. On a terminal the bar redraws in place; into a file or a pipe (a
CI log, ``2> run.log``) a plain line is written at most every
``every_seconds``, and at the end, so a log stays short and readable.
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

BYTES, RUNS = "bytes", "runs"
"""What a display counts: input bytes (``skpub run``) or runs (``skpub simulate``)."""


class ProgressDisplay:
    """One task's progress on ``stream``.

    Parameters
    ----------
    stream : text stream
        Where to draw (standard error); a live bar when it is a terminal.
    total : float, optional
        The amount of work (bytes or runs); None when unknown (standard
        input): no percentage and no ETA then.
    unit : str
        :data:`BYTES` or :data:`RUNS`.
    every_seconds : float
        Least seconds between two plain lines.
    """

    def __init__(self, stream: TextIO, total: float | None, unit: str = BYTES, every_seconds: float = 5.0) -> None:
        self.stream, self.total, self.unit, self.every_seconds = stream, total, unit, every_seconds
        self.started = time.perf_counter()
        self._last_line = float("-inf")
        self._live: Progress | None = None
        self._task: TaskID | None = None
        if _is_terminal(stream):
            counted = DownloadColumn() if unit == BYTES else MofNCompleteColumn()
            self._live = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=24),
                counted,
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[figures]}"),
                console=Console(file=stream),
                transient=False,
                redirect_stdout=False,  # the engine's own output (Spark's, in a file) stays where it goes
                redirect_stderr=False,
            )
            self._live.start()
            self._task = self._live.add_task("starting", total=total, figures="")

    @property
    def live(self) -> bool:
        """Whether a live bar is drawn (the stream is a terminal)."""
        return self._live is not None

    def update(self, completed: float, description: str, figures: str, force: bool = False) -> None:
        """Show ``completed`` of the total with ``description`` and ``figures`` (a plain line at most every N s)."""
        if self._live is not None:
            self._live.update(self._task, completed=completed, description=description, figures=figures)
            return
        now = time.perf_counter()
        if force or now - self._last_line >= self.every_seconds:
            self._last_line = now
            print(f"[skpub] {description}: {figures}{self._share(completed, now)}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Print a line above the bar (or as a plain line)."""
        if self._live is not None:
            self._live.console.print(f"[skpub] {text}", markup=False, highlight=False)
        else:
            print(f"[skpub] {text}", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop drawing (the bar stays as it was last drawn)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _share(self, completed: float, now: float) -> str:
        """Return `` · 42% of 1.2 GB, ETA 3 min`` (nothing when the total is unknown)."""
        if not self.total:
            return ""
        share = min(completed / self.total, 1.0)
        elapsed = now - self.started
        eta = elapsed * (1 - share) / share if 0 < share < 1 else None
        size = _size(self.total) if self.unit == BYTES else f"{self.total:.0f} runs"
        left = "" if eta is None else f", ETA {_duration(eta)}"
        return f" · {share:.0%} of {size}{left}"


def _size(count: float) -> str:
    """Return a byte count as ``12.3 MB`` or ``45.6 kB``."""
    return f"{count / 1e6:,.1f} MB" if count >= 1e6 else f"{count / 1e3:,.1f} kB"


def _duration(seconds: float) -> str:
    """Return ``seconds`` as ``12 s``, ``3 min 5 s`` or ``1 h 2 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
