"""The layout of a Spark run's checkpoint directory, and who may touch it.

::

    skpub-checkpoint.json    written first, when skpub creates the checkpoint
    manifest.json        deployment, input fingerprint, output directory, run id
    source/chunk-<b>-<p>.raw the staged input of checkpoints before format 6 (cleared, never read)
    epochs/epoch-<n>.json    published routing epochs (those of the last batches: older ones are pruned)
    router/              the id registry: delta-<b>.json journals,
                         base-<b>.json the whole registry, report-<b>.json counters
    merge/               the ranked merge's results: delta-<b>.json changes, base-<b>.json all of them
                         (bases were named snapshot-<b>.json before 2026-11-27: still read)
    located/rows-<b>-<p>.arrow micro-batch b's located rows of part p (Arrow IPC stream),
                         written by the parse task, read by the sequencer task
    routed/rows-<b>-<e>.arrow  micro-batch b's routed rows for evaluator e (Arrow IPC stream),
                         written by the sequencer task, read by the evaluator's task
    balancer/            rebalancing in flight (skpub.kernel.transfer): plan-<b>.json decided after
                         micro-batch b by the driver, handoff-<b+1>-<e>.json written by source evaluator e
    query/               Spark's own streaming checkpoint

skpub recognizes its checkpoint by the marker file and this layout. A
non-empty directory without the marker, or holding anything outside the
layout, is refused (:func:`checkpoint_foreign_entries`), and
:meth:`Checkpoint.clear` removes only skpub's own parts of it, so a
checkpoint never deletes a directory or file that skpub did not create.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from skpub.kernel.errors import CheckpointError
from skpub.kernel.storage import BATCH, atomic_write_text, entries, own_files
from skpub.router.epoch import EPOCH_NAME

CHECKPOINT_DIR = "_checkpoint"
MARKER = "skpub-checkpoint.json"
MANIFEST = "manifest.json"
_OWN = {
    "source": own_files(rf"chunk-{BATCH}(-\d{{3}})?\.raw"),  # staged input before format 6: cleared, never read
    "epochs": own_files(EPOCH_NAME),
    "router": own_files(rf"(?:delta|base|snapshot|report)-{BATCH}\.json"),  # snapshot: a base, named before 2026-11-27
    "merge": own_files(rf"(?:delta|base|snapshot)-{BATCH}\.json"),
    "located": own_files(rf"rows-{BATCH}-\d{{3,}}\.arrow"),
    "routed": own_files(rf"rows-{BATCH}-\d{{3,}}\.arrow"),
    "balancer": own_files(rf"(?:plan-{BATCH}|handoff-{BATCH}-\d{{3,}})\.json"),
}
_OWN_FILES_RE = own_files(r"manifest\.json|skpub-checkpoint\.json")
_ROW_FILE_RE = own_files(rf"rows-(?P<batch>{BATCH})-\d{{3,}}\.arrow")
_BALANCER_FILE_RE = own_files(rf"(?:plan|handoff)-(?P<batch>{BATCH})(?:-\d{{3,}})?\.json")
_MARKER_RE = own_files(r"skpub-checkpoint\.json")


LEGACY_BASE = "snapshot"
"""What a base file was named before 2026-11-27: read as a base, so older checkpoints still resume."""


def _numbered(folder: Path, kind: str) -> dict[int, Path]:
    """Batch id -> file of ``folder``'s ``<kind>-<batch>.json`` files; a ``base`` includes :data:`LEGACY_BASE`'s.

    Where a batch has both names (a base written again after an upgrade), the new name wins.
    """
    kinds = (LEGACY_BASE, kind) if kind == "base" else (kind,)
    return {b: p for k in kinds for b, p in _files_of(folder, k)}


def newest_base(bases: dict[int, Path], batch_id: int) -> int:
    """Return the newest batch of ``bases`` before ``batch_id`` (-1: none), the base a replay of ``batch_id`` reads."""
    return max((b for b in bases if b < batch_id), default=-1)


def _files_of(folder: Path, kind: str) -> list[tuple[int, Path]]:
    """(batch id, file) of ``folder``'s ``<kind>-<batch>.json`` files (a batch id as :data:`BATCH`), by batch."""
    name = re.compile(rf"{re.escape(kind)}-({BATCH})\.json", re.ASCII)
    found = [(int(m.group(1)), path) for path in folder.glob(f"{kind}-*.json") if (m := name.fullmatch(path.name))]
    return sorted(found)


def checkpoint_foreign_entries(root: Path) -> list[str]:
    """Relative paths under checkpoint ``root`` that skpub did not write (``query/`` is Spark's own).

    Without skpub's marker file (or its temporary name, when a run was killed
    while writing it) every entry is foreign: skpub did not create the
    directory. Checkpoints of skpub before the marker existed are refused too.
    """
    found = entries(root)
    if not any(_MARKER_RE.fullmatch(entry.name) and kind == "file" for entry, kind in found):
        return [entry.name for entry, _ in found]
    foreign = []
    for entry, kind in found:
        name = entry.name
        if name in _OWN and kind == "dir":
            pattern = _OWN[name]
            foreign += [f"{name}/{e.name}" for e, k in entries(entry) if k != "file" or not pattern.fullmatch(e.name)]
        elif name == "query" and kind == "dir" or _OWN_FILES_RE.fullmatch(name) and kind == "file":
            continue
        else:
            foreign.append(name)
    return foreign


_SPARK_TEMPORARY = re.compile(r"\.\.?\d+\.[0-9a-f-]{36}\.tmp(\.crc)?")
"""A temporary file of Spark's checkpoint file manager (``.<batch>.<uuid>.tmp`` and its checksum)."""


class Checkpoint:
    """A checkpoint directory at ``root`` (created on first use)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()
        self.source = self.root / "source"
        self.epochs = self.root / "epochs"
        self.router = self.root / "router"
        self.merge = self.root / "merge"
        self.located = self.root / "located"
        self.routed = self.root / "routed"
        self.balancer = self.root / "balancer"
        self.query = self.root / "query"
        self.manifest = self.root / MANIFEST

    def check_owned(self) -> None:
        """Refuse a checkpoint path that holds anything skpub did not write.

        Raises
        ------
        CheckpointError
            If the path is not a directory or holds foreign entries.
        """
        if not self.root.exists() and not self.root.is_symlink():
            return
        if not self.root.is_dir():
            raise CheckpointError(f"checkpoint {self.root} exists and is not a directory")
        foreign = checkpoint_foreign_entries(self.root)
        if foreign:
            raise CheckpointError(
                f"checkpoint directory {self.root} holds files skpub did not write ({', '.join(foreign[:5])}); "
                "skpub never deletes them: pass another --checkpoint"
            )

    def create(self) -> None:
        """Make this an empty checkpoint of skpub's: the directory, its marker, none of a previous run's state.

        Raises
        ------
        CheckpointError
            If the directory holds anything skpub did not write.
        """
        self.clear()
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.root / MARKER, json.dumps({"format": 1}))

    def read_manifest(self) -> dict | None:
        """Return the manifest, or None when the checkpoint has none (new, or setup never finished).

        Raises
        ------
        CheckpointError
            If the manifest is not JSON.
        """
        if not self.manifest.is_file():
            return None
        try:
            manifest = json.loads(self.manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint manifest {self.manifest} is damaged: {exc}") from None
        if not isinstance(manifest, dict):
            raise CheckpointError(f"checkpoint manifest {self.manifest} is damaged")
        return manifest

    def clear(self) -> None:
        """Remove skpub's own checkpoint contents (after :meth:`check_owned`), keeping the directory."""
        self.check_owned()
        if not self.root.is_dir():
            return
        self.manifest.unlink(missing_ok=True)
        for name in (*_OWN, "query"):
            folder = self.root / name
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)

    def router_file(self, kind: str, batch_id: int) -> Path:
        """Return the id registry's ``delta`` (changes in micro-batch ``batch_id``) or ``base`` (all of it after it)."""
        return self.router / f"{kind}-{batch_id:08d}.json"

    def router_files(self, kind: str) -> dict[int, Path]:
        """Batch id -> file, for the registry's ``delta`` or ``base`` files (:func:`_numbered`)."""
        return _numbered(self.router, kind)

    def merge_file(self, kind: str, batch_id: int) -> Path:
        """Return the merge's ``delta`` (changes in micro-batch ``batch_id``) or ``base`` (all results after it)."""
        return self.merge / f"{kind}-{batch_id:08d}.json"

    def merge_files(self, kind: str) -> dict[int, Path]:
        """Batch id -> file, for the merge's ``delta`` or ``base`` files (:func:`_numbered`)."""
        return _numbered(self.merge, kind)

    def prune_states(self, batch_id: int) -> None:
        """Remove the registry's and the merge's files no replay of ``batch_id`` or later can need.

        A replay of ``batch_id`` reads the newest base before it and every
        delta after that base; older bases and those deltas go, and so does
        a base under its old name (:data:`LEGACY_BASE`) once it is older
        or was written again under the new one. The routing reports of
        earlier batches go too (a replay's sequencer writes its own again).
        """
        for b, path in _files_of(self.router, "report"):
            if b < batch_id:
                path.unlink(missing_ok=True)
        for folder in (self.router, self.merge):
            bases = _numbered(folder, "base")
            keep = newest_base(bases, batch_id)
            for b, path in [*_files_of(folder, "base"), *_files_of(folder, LEGACY_BASE)]:
                if b < keep or bases[b] != path:
                    path.unlink(missing_ok=True)
            for b, path in _files_of(folder, "delta"):
                if b <= keep:
                    path.unlink(missing_ok=True)

    def located_file(self, batch_id: int, part: int) -> Path:
        """Return the file of micro-batch ``batch_id``'s located rows of slice ``part``."""
        return self.located / f"rows-{batch_id:08d}-{part:03d}.arrow"

    def routed_file(self, batch_id: int, evaluator: int) -> Path:
        """Return the file of micro-batch ``batch_id``'s routed rows for evaluator ``evaluator`` (its index)."""
        return self.routed / f"rows-{batch_id:08d}-{evaluator:03d}.arrow"

    def row_files(self) -> dict[int, list[Path]]:
        """Batch id -> its located and routed row files, with the temporary names a killed write leaves.

        Only names of skpub's own layout count (anything else there is
        foreign, :func:`checkpoint_foreign_entries`).
        """
        out: dict[int, list[Path]] = {}
        for folder in (self.located, self.routed):
            for path in folder.glob("*rows-*.arrow*") if folder.is_dir() else ():
                match = _ROW_FILE_RE.fullmatch(path.name)
                if match is not None:
                    out.setdefault(int(match["batch"]), []).append(path)
        return out

    def balancer_files(self) -> dict[int, list[Path]]:
        """Batch id -> the plans decided after it and the hand-offs written after it (with temporary names)."""
        out: dict[int, list[Path]] = {}
        for path in self.balancer.glob("*.json*") if self.balancer.is_dir() else ():
            match = _BALANCER_FILE_RE.fullmatch(path.name)
            if match is not None:
                out.setdefault(int(match["batch"]), []).append(path)
        return out

    def router_report(self, batch_id: int) -> Path:
        """Router counters of micro-batch ``batch_id``."""
        return self.router / f"report-{batch_id:08d}.json"

    def drop_interrupted_writes(self) -> list[str]:
        """Remove what a kill left of Spark's atomic writes to its offset and commit logs; return their names.

        Spark writes a log entry to a hidden temporary file (``.0.<uuid>.tmp``
        and its ``..0.<uuid>.tmp.crc``) and renames it; killed between the
        two, the temporary stays. Spark ignores it when reading, but since
        SPARK-53103 a query whose offset log has no entry refuses an offset
        directory that is not empty (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``),
        so a kill while the first micro-batch was planned would stop every
        restart. Only those temporaries are removed: their entry was never
        written, so nothing read them.
        """
        dropped = []
        for log in ("offsets", "commits"):
            folder = self.query / log
            for path in folder.iterdir() if folder.is_dir() else ():
                if _SPARK_TEMPORARY.fullmatch(path.name) and path.is_file():
                    path.unlink()
                    dropped.append(f"{log}/{path.name}")
        return dropped

    def newest(self, log: str) -> int:
        """Return the newest micro-batch in Spark's ``log`` (``"offsets"`` or ``"commits"``), -1 when none."""
        folder = self.query / log
        ids = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
        return max(ids, default=-1)

    def all_committed(self) -> bool:
        """Whether Spark committed every micro-batch it planned (the newest offset has a commit)."""
        return self.newest("commits") == self.newest("offsets")
