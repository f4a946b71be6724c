"""Routing epochs: immutable, versioned routing tables (DESIGN "Over micro-batches, on both engines").

Epoch ``n`` is in force from micro-batch ``from_batch`` until the next
epoch's ``from_batch``. Epochs are published as JSON files
``epoch-<n>.json`` in an epoch directory (inside the checkpoint for Spark) and
never changed, so a replayed micro-batch routes exactly as its first attempt:
a router picks the epoch by the batch id alone. Epochs no batch still to be
run routes by are pruned (:meth:`EpochLog.prune`, by the Spark driver once a
batch is written), so the directory holds the last few.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from skpub.kernel.geometry import Rect
from skpub.kernel.grid import FineGrid
from skpub.kernel.storage import atomic_write_text, own_files
from skpub.router.agrid import AGrid
from skpub.router.errors import EpochError, RoutingError
from skpub.router.gridt import TermTable
from skpub.router.partitioning import Partitioning
from skpub.router.table import RoutingTable
from skpub.router.uniform import UniformGrid

EPOCH_NAME = r"epoch-(?P<number>\d{6}|[1-9]\d{6,})\.json"
"""An epoch's file name as ``f"epoch-{n:06d}.json"`` writes it (epoch 1,000,000 too); group ``number`` is its number."""
_EPOCH_FILE = own_files(EPOCH_NAME)


@dataclass(frozen=True)
class RoutingEpoch:
    """Routing table ``table`` in force from micro-batch ``from_batch`` on."""

    number: int
    from_batch: int
    table: RoutingTable

    def to_json(self) -> dict:
        """Return the JSON form stored in the epoch directory (``texts``: the term tables, when any)."""
        grid, partitioning = self.table.grid, self.table.partitioning
        out = {
            "number": self.number,
            "from_batch": self.from_batch,
            "kind": self.table.kind,
            "space": grid.space.as_list(),
            "grid_size": grid.size,
            "boxes": partitioning.boxes.tolist(),
            "owners": partitioning.owners.tolist(),
        }
        if partitioning.has_text:
            out["texts"] = [None if t is None else t.to_json() for t in partitioning.texts]
        return out

    @classmethod
    def from_json(cls, raw: dict) -> RoutingEpoch:
        """Rebuild an epoch from :meth:`to_json` output.

        Raises
        ------
        EpochError
            If the JSON is not an epoch.
        """
        try:
            grid = FineGrid(Rect(*raw["space"]), int(raw["grid_size"]))
            boxes = np.array(raw["boxes"], dtype=np.int32)
            owners = np.array(raw.get("owners", range(len(boxes))), dtype=np.int32)
            texts = raw.get("texts")
            if texts is not None:
                texts = tuple(None if t is None else TermTable.from_json(t) for t in texts)
            if raw["kind"] == "uniform":
                table: RoutingTable = UniformGrid(grid, len(boxes))
            elif raw["kind"] == "agrid":
                table = AGrid(grid, Partitioning(grid.size, boxes, owners, texts))
            else:
                raise EpochError(f"unknown routing table kind {raw['kind']!r}")
            return cls(int(raw["number"]), int(raw["from_batch"]), table)
        except (KeyError, TypeError, ValueError, RoutingError) as exc:
            raise EpochError(f"damaged epoch: {exc}") from exc


class EpochLog:
    """The published epochs of one deployment, in a directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def publish(self, epoch: RoutingEpoch) -> None:
        """Write ``epoch`` atomically; an epoch number is written once and never changed.

        Epochs start later as their numbers grow (:meth:`for_batch` reads
        only the newest ones because of it): epoch ``n`` must start after
        epoch ``n - 1`` and before epoch ``n + 1``, where those are
        published (:meth:`check_order`).

        Raises
        ------
        EpochError
            If an epoch with that number but other content exists, or the
            order would break.
        """
        path = self._path(epoch.number)
        text = json.dumps(epoch.to_json())
        if path.exists():
            if path.read_text(encoding="utf-8") != text:
                raise EpochError(f"epoch {epoch.number} already published with other content")
            return
        self.check_order(epoch)
        atomic_write_text(path, text)

    def check_order(self, epoch: RoutingEpoch) -> None:
        """Check that ``epoch`` starts after epoch ``number - 1`` and before epoch ``number + 1``, where published.

        Raises
        ------
        EpochError
            If it does not.
        """
        for neighbour in (epoch.number - 1, epoch.number + 1):
            if neighbour < 0 or not self._path(neighbour).exists():
                continue
            other = self._read(neighbour)
            earlier, later = (other, epoch) if neighbour < epoch.number else (epoch, other)
            if earlier.from_batch >= later.from_batch:
                side = "after" if other is earlier else "before"
                raise EpochError(
                    f"epoch {epoch.number} from batch {epoch.from_batch} would not start {side} epoch "
                    f"{other.number}, from batch {other.from_batch}"
                )

    def prune(self, batch_id: int) -> list[int]:
        """Remove the epochs older than the one in force for micro-batch ``batch_id``; return their numbers.

        No batch at or after ``batch_id`` routes by them, so a run that only
        replays such batches keeps O(epochs published since) files instead
        of every epoch of its life; the temporary files of such epochs that
        a killed publish left go too. Nothing goes when no epoch is in force
        for ``batch_id``.
        """
        try:
            keep = self.for_batch(batch_id).number
        except EpochError:  # none in force yet (the first batches), or the newest unreadable: the next task says so
            return []
        gone = [number for number in self.numbers() if number < keep]
        for number in gone:
            self._path(number).unlink(missing_ok=True)
        for path in self.directory.glob(".epoch-*.tmp"):  # what a publish killed mid-write left of an older epoch
            match = _EPOCH_FILE.fullmatch(path.name)
            if match is not None and match["temporary"] and int(match["number"]) < keep:
                path.unlink(missing_ok=True)
        return gone

    def _path(self, number: int) -> Path:
        return self.directory / f"epoch-{number:06d}.json"

    def _read(self, number: int) -> RoutingEpoch:
        path = self._path(number)
        try:
            version = path.stat().st_mtime_ns
        except OSError as exc:
            raise EpochError(f"cannot read epoch {path}: {exc}") from exc
        return _load(str(path), version)

    def numbers(self) -> list[int]:
        """Return the published epoch numbers, ascending (files of skpub's names only: :data:`EPOCH_NAME`)."""
        named = (_EPOCH_FILE.fullmatch(p.name) for p in self.directory.glob("epoch-*.json"))
        return sorted(int(m["number"]) for m in named if m is not None and not m["temporary"])

    def for_batch(self, batch_id: int) -> RoutingEpoch:
        """Return the epoch in force for micro-batch ``batch_id``: the newest that starts at or before it.

        Reads epochs from the newest back and stops at the first that
        starts at or before ``batch_id`` (they start later as their numbers
        grow: :meth:`publish`), so a batch of the epoch in force or
        of the one before (a transfer's batch) reads one or two, however
        many were published: O(epochs) for the directory listing, O(1)
        epoch files parsed when the last ones are cached.

        Raises
        ------
        EpochError
            If no published epoch starts at or before ``batch_id``.
        """
        for number in reversed(self.numbers()):
            epoch = self._read(number)
            if epoch.from_batch <= batch_id:
                return epoch
        raise EpochError(f"no routing epoch in {self.directory} for batch {batch_id} (older ones are pruned)")


@lru_cache(maxsize=16)
def _load(path: str, version: int) -> RoutingEpoch:
    """Load one epoch file; cached by path and modification time (a new run may publish at the same path)."""
    try:
        return RoutingEpoch.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise EpochError(f"cannot read epoch {path}: {exc}") from exc
