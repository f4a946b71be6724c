"""The output directory layout of SEMANTICS section 5, and who may touch it.

``DIR/deliveries``, ``DIR/snapshots``, ``DIR/dead_letters`` and
``DIR/statistics`` each hold JSON-lines part files named by batch id and
writer (:mod:`skpub.kernel.parts`), so a replayed batch replaces its first
attempt: sinks are idempotent per batch id. ``DIR/_SUCCESS`` is written last,
once the whole input was processed; output without it is partial.

skpub never destroys what it did not write. :func:`inspect_output` lists
every entry of ``DIR`` outside skpub's own layout (:data:`LAYOUT`: the stream
folders and their part files, ``_SUCCESS``, the run marker, the default
workload and checkpoint folders); a directory holding any is refused. Only
skpub's own part files are ever removed, never through a symbolic link.
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from skpub.app.checkpoint import CHECKPOINT_DIR, checkpoint_foreign_entries
from skpub.kernel.errors import OutputError
from skpub.kernel.parts import PART_RE, STREAMS, batch_parts, rename_eight_digit_parts
from skpub.kernel.storage import atomic_write_text, entries, own_files

SUCCESS = "_SUCCESS"
RUN_MARKER = "_skpub_run.json"
ENGINE_LOG = "_engine.log"
"""The Spark engine's log lines (:mod:`skpub.app.console`)."""
WORKLOAD_DIR = "_workload"
TOP_FILES_RE = own_files(rf"{SUCCESS}|{re.escape(RUN_MARKER)}|{re.escape(ENGINE_LOG)}")
WORKLOAD_RE = own_files(r"stream\.jsonl|vocabulary\.json|spec\.json|deployment\.json|\.stream\.jsonl\.tmp")
MARKER_FORMAT = 1


@dataclass(frozen=True)
class OutputState:
    """What an output directory holds: ``finished`` (a ``_SUCCESS``) and the run id that wrote it."""

    root: Path
    finished: bool
    run_id: str | None


def _foreign(root: Path) -> list[str]:
    """Relative paths under ``root`` that skpub did not write (empty when all is skpub's)."""
    foreign: list[str] = []
    for entry, kind in entries(root):
        name = entry.name
        if name in STREAMS and kind == "dir":
            foreign += _unowned(entry, PART_RE)
        elif TOP_FILES_RE.fullmatch(name) and kind == "file":
            continue
        elif name == WORKLOAD_DIR and kind == "dir":
            foreign += _unowned(entry, WORKLOAD_RE)
        elif name == CHECKPOINT_DIR and kind == "dir":
            foreign += [f"{name}/{p}" for p in checkpoint_foreign_entries(entry)]
        else:
            foreign.append(name)
    return foreign


def _unowned(folder: Path, pattern: re.Pattern[str]) -> list[str]:
    """Entries of ``folder`` that are not regular files named by ``pattern``."""
    return [f"{folder.name}/{e.name}" for e, kind in entries(folder) if kind != "file" or not pattern.fullmatch(e.name)]


def inspect_output(root: str | Path) -> OutputState:
    """Check that ``root`` is absent, empty, or holds only skpub's own output; read its state.

    Raises
    ------
    OutputError
        If ``root`` is not a directory, or holds anything skpub did not write
        there (the message names up to five such entries).
    """
    root = Path(root)
    if not root.exists() and not root.is_symlink():
        return OutputState(root, False, None)
    if not root.is_dir():
        raise OutputError(f"output {root} exists and is not a directory")
    foreign = _foreign(root)
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(
            f"output directory {root} holds files skpub did not write ({shown}); "
            "skpub never replaces them: choose another --output or move them away"
        )
    run_id = None
    marker = root / RUN_MARKER
    if marker.is_file():
        try:
            run_id = str(json.loads(marker.read_text(encoding="utf-8"))["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            run_id = None
    return OutputState(root, (root / SUCCESS).is_file(), run_id)


def check_output(root: str | Path, overwrite: bool) -> OutputState:
    """:func:`inspect_output`, and refuse a finished earlier output unless ``overwrite``.

    Raises
    ------
    OutputError
        As :func:`inspect_output`, or if ``root`` holds a finished run and
        ``overwrite`` is false.
    """
    state = inspect_output(root)
    if state.finished and not overwrite:
        raise OutputError(
            f"output directory {state.root} holds the finished output of an earlier run; "
            "pass --overwrite to replace it, or choose another --output"
        )
    return state


def claim_output(root: str | Path, run_id: str, overwrite: bool, resume: bool = False) -> Path:
    """Make ``root`` this run's output directory; return its path.

    Parameters
    ----------
    run_id : str
        Written into the run marker; a resumed Spark run checks it.
    overwrite : bool
        Whether a finished earlier output may be replaced.
    resume : bool
        Keep the part files (a resumed run completes them; those an older
        skpub named with eight digits take their current names, so name
        order stays batch order); otherwise every part file of an earlier
        run is removed, so a new run's output is never mixed with an old one's.

    Raises
    ------
    OutputError
        If ``root`` holds foreign files, holds a finished run and
        ``overwrite`` is false, or cannot be written.
    """
    root = check_output(root, overwrite).root
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / SUCCESS).unlink(missing_ok=True)
        for stream in STREAMS:
            folder = root / stream
            folder.mkdir(exist_ok=True)
            if not resume:
                for part, kind in entries(folder):
                    if kind == "file" and PART_RE.fullmatch(part.name):
                        part.unlink()
        if resume:
            rename_eight_digit_parts(root)
        atomic_write_text(root / RUN_MARKER, json.dumps({"format": MARKER_FORMAT, "run_id": run_id}))
    except OSError as exc:
        raise OutputError(f"cannot write output directory {root}: {exc.strerror or exc}") from None
    return root


class PartRetention:
    """Keeps one stream's part files within ``keep_bytes`` of disk, removing the oldest batches' first.

    A long-running daemon's balancer log (``output/balancer``: one part per
    batch that rebalanced) keeps the retention of an output log this way.
    The folder is listed once, when this is made; then each committed batch
    is told to :meth:`add`, so a batch costs O(its parts + the parts
    removed), never a listing of the folder. Only skpub's own part files
    (:data:`~skpub.kernel.parts.PART_RE`, regular files, never through a
    link) are counted and removed; the newest batch's stay whatever they
    weigh. A part weighs its disk use (``max(size, blocks x 512)`` bytes:
    a small file takes a whole block).

    Raises
    ------
    OSError
        From the listing, if the folder cannot be read.
    """

    def __init__(self, root: str | Path, stream: str, keep_bytes: int) -> None:
        self.root, self.stream, self.keep_bytes = Path(root), stream, keep_bytes
        self.total = 0
        self._parts: dict[int, list[tuple[Path, int]]] = {}  # batches holding parts, inserted in ascending order
        self._last: int | None = None  # the newest batch told or listed
        folder = self.root / stream
        if not folder.is_dir() or folder.is_symlink() or self.root.is_symlink():
            return
        listed: dict[int, list[Path]] = {}
        for path, kind in entries(folder):
            match = PART_RE.fullmatch(path.name)
            if kind == "file" and match is not None and not match["temporary"]:
                listed.setdefault(int(match["batch"]), []).append(path)
        for batch in sorted(listed):
            self._account(batch, listed[batch])

    def add(self, batch_id: int) -> None:
        """Count the parts of the batches after the last one told, up to ``batch_id`` (whose parts are written)."""
        if batch_id < 0:
            return
        start = batch_id if self._last is None else self._last + 1
        for batch in range(start, batch_id + 1):
            self._account(batch, batch_parts(self.root, self.stream, batch))

    def retain(self) -> int:
        """Remove the oldest batches' parts while all weigh more than ``keep_bytes``; return how many went.

        Raises
        ------
        OSError
            If a part cannot be removed (it is tried again at the next call).
        """
        removed = 0
        while self.total > self.keep_bytes and len(self._parts) > 1:
            batch = next(iter(self._parts))
            parts = self._parts[batch]
            while parts:  # a part counts until it is gone: a removal that fails is tried again, counted once
                path, size = parts[-1]
                path.unlink(missing_ok=True)
                parts.pop()
                self.total -= size
                removed += 1
            del self._parts[batch]
        return removed

    def _account(self, batch: int, paths: list[Path]) -> None:
        parts = []
        for path in paths:
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                parts.append((path, max(st.st_size, st.st_blocks * 512)))
        self._last = batch if self._last is None else max(self._last, batch)
        if not parts:
            return
        self._parts.setdefault(batch, []).extend(parts)
        self.total += sum(size for _, size in parts)


def mark_success(root: str | Path, run_id: str) -> None:
    """Write the empty ``_SUCCESS`` marker: the whole input was processed (written last).

    Raises
    ------
    OutputError
        If the run marker no longer names ``run_id`` (another run claimed the
        directory meanwhile, so this run's output is not whole), or files
        skpub did not write appeared in it during the run.
    """
    if inspect_output(root).run_id != run_id:
        raise OutputError(f"another run took over output directory {root} while this one ran; its output is partial")
    atomic_write_text(Path(root) / SUCCESS, "")
