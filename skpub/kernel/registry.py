"""The id registry: the validation that depends on the stream so far.

``duplicate_id`` and ``unknown_id`` of SEMANTICS section 1 cannot be decided
from one line: they need the ids accepted before. :class:`IdRegistry` keeps
them per record type, and the active subscriptions with a *placement* chosen
by its owner (the router stores where a subscription lives, so its
unsubscribe reaches the same evaluators).

Subscription and snapshot ids are unique for the whole stream. Object ids are
the high-volume stream: they are unique only among the most recent
``object_id_horizon`` accepted objects, kept by
:class:`~skpub.kernel.horizon.ObjectIdHorizon` in memory fixed when the
registry is made, so it is bounded by the horizon, not by the stream.

Durable form: :meth:`IdRegistry.to_json` / :meth:`IdRegistry.from_json` and
the journal are plain JSON values (versioned by the engine that stores them);
placements go through codec functions supplied by their owner. Nothing here
ever unpickles or executes what it loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from skpub.kernel.config import DEFAULT_OBJECT_ID_HORIZON, physical_memory
from skpub.kernel.decode import clip
from skpub.kernel.errors import CheckpointError
from skpub.kernel.horizon import ObjectIdHorizon, memory_bytes
from skpub.kernel.records import (
    ObjectRecord,
    Record,
    SnapshotMarker,
    Unsubscribe,
)

KINDS = ("object", "subscribe", "unsubscribe", "snapshot")
"""Registry kinds: every subscription kind (range, topk, knn) is a ``subscribe``."""

Change = tuple[str, str, Any]
"""One accepted change: ``(type, id, placement)`` with type object, subscribe, unsubscribe or snapshot."""

Rejection = tuple[str, str]
"""``(reason, message)`` of a record the stream so far rejects."""


@dataclass
class IdRegistry:
    """Ids accepted so far, per type, and the active subscriptions' placements.

    Memory: O(object_id_horizon) for object ids, allocated here
    (:class:`~skpub.kernel.horizon.ObjectIdHorizon`, 80 MiB for the default
    10^6), O(subscriptions and snapshots ever accepted) for the others
    (SEMANTICS section 1).

    With ``journal`` a list, every accepted change is also appended there, so
    an engine can persist one micro-batch's changes (O(batch)) instead of the
    whole registry; :meth:`replay` applies them again.
    """

    object_id_horizon: int = DEFAULT_OBJECT_ID_HORIZON
    objects: ObjectIdHorizon | None = None
    subscription_ids: set[str] = field(default_factory=set)
    snapshot_ids: set[str] = field(default_factory=set)
    active: dict[str, Any] = field(default_factory=dict)
    journal: list[Change] | None = None
    objects_accepted: int = 0
    watermark: float | None = None

    def __post_init__(self) -> None:
        if self.objects is None:
            self.objects = ObjectIdHorizon(self.object_id_horizon)

    def to_json(self, encode_placement: Callable[[Any], Any]) -> dict[str, Any]:
        """Return the registry (without its journal) as a JSON value.

        The object-id horizon's hashes are not in it: write
        ``self.objects.hash_buffers()`` beside it and pass their bytes to
        :meth:`from_json`.
        """
        return {
            "object_id_horizon": self.object_id_horizon,
            "objects_accepted": self.objects_accepted,
            "watermark": self.watermark,
            "objects": self.objects.to_json(),
            "subscriptions": sorted(self.subscription_ids),
            "snapshots": sorted(self.snapshot_ids),
            "active": {sid: encode_placement(p) for sid, p in self.active.items()},
        }

    @classmethod
    def from_json(
        cls, raw: Any, decode_placement: Callable[[Any], Any], hashes: bytes | memoryview | None = None
    ) -> IdRegistry:
        """Rebuild a registry from :meth:`to_json` output and its horizon's hash bytes.

        ``hashes`` is ``None`` for the older durable forms, whose horizon
        held its ids (router state format 3) or its hashes as base64 (4).

        Raises
        ------
        CheckpointError
            If ``raw`` is not of that shape (damaged or foreign state), or its
            horizon would take more than half of this machine's memory.
        """
        try:
            horizon = int(raw["object_id_horizon"])
            if not 1 <= horizon or memory_bytes(horizon) > physical_memory() // 2:
                raise ValueError(f"an object-id horizon of {horizon} ids")
            registry = cls(horizon, _horizon(raw["objects"], horizon, hashes))
            registry.objects_accepted = int(raw["objects_accepted"])
            registry.watermark = _clock(raw["watermark"])
            registry.subscription_ids = {_string(s) for s in raw["subscriptions"]}
            registry.snapshot_ids = {_string(s) for s in raw["snapshots"]}
            registry.active = {_string(s): decode_placement(p) for s, p in raw["active"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"damaged id registry: {exc!r}") from None
        return registry

    def advance_clock(self, watermark: float | None) -> None:
        """Set the watermark (the largest object time so far, seconds; SEMANTICS section 4), journaled."""
        if watermark != self.watermark:
            self.watermark = watermark
            if self.journal is not None:
                self.journal.append(("clock", "", watermark))

    def take_journal(self) -> list[Change]:
        """Return the changes journaled since the last call and start a new journal."""
        changes, self.journal = self.journal or [], []
        return changes

    def accept_objects(self, oids: list[str]) -> dict[int, Rejection]:
        """Accept a batch's object ids in stream order (journaled); return ``index -> rejection`` of the duplicates.

        O(len(oids)), vectorized (:meth:`ObjectIdHorizon.add`).
        """
        held = self.objects.add(oids)
        rejections = {k: _duplicate_object(oids[k], self.object_id_horizon) for k in held}
        accepted = [oid for k, oid in enumerate(oids) if k not in rejections] if held else oids
        if self.journal is not None:
            self.journal.extend(zip(repeat("object"), accepted, repeat(None)))
        self.objects_accepted += len(accepted)
        return rejections

    def replay_objects(self, oids: list[str]) -> None:
        """Apply journaled object ids, in order (not journaled again)."""
        self.objects.add(oids)
        self.objects_accepted += len(oids)

    def replay(self, changes: Iterable[Change]) -> None:
        """Apply journaled changes, in order (not journaled again).

        Raises
        ------
        CheckpointError
            If a change does not fit the registry (a damaged journal).
        """
        for rtype, rid, placement in changes:
            if rtype == "object":
                self.objects.add([rid])
                self.objects_accepted += 1
            elif rtype == "subscribe":
                self.subscription_ids.add(rid)
                self.active[rid] = placement
            elif rtype == "unsubscribe":
                if self.active.pop(rid, None) is None:
                    raise CheckpointError(f"damaged journal: unsubscribe of {_show(rid)}, which is not active")
            elif rtype == "place":
                if rid not in self.active:
                    raise CheckpointError(f"damaged journal: placement of {_show(rid)}, which is not active")
                self.active[rid] = placement
            elif rtype == "clock":
                self.watermark = _clock(placement)
            else:
                self.snapshot_ids.add(rid)

    def check(self, kind: str, rid: str) -> Rejection | None:
        """Return ``(reason, message)`` if the stream so far rejects a record of ``kind`` and id ``rid``.

        ``kind`` is one of :data:`KINDS`. Does not change the registry. O(1).
        """
        if kind == "object":
            if rid in self.objects:
                return _duplicate_object(rid, self.object_id_horizon)
        elif kind == "unsubscribe":
            if rid not in self.active:
                return _unknown_subscription(rid)
        elif kind == "snapshot":
            if rid in self.snapshot_ids:
                return "duplicate_id", f"snapshot id {_show(rid)} was already accepted"
        elif rid in self.subscription_ids:
            return _duplicate_subscription(rid)
        return None

    def accept_id(self, kind: str, rid: str, placement: Any = None) -> Any:
        """Record an accepted record of ``kind`` and id ``rid``; for an unsubscribe, return the placement it ends.

        Objects are numbered here: :attr:`objects_accepted` counts every
        object accepted so far (count windows, SEMANTICS section 4). O(1).
        """
        ended = None
        if kind == "object":
            self.objects.add([rid])
            self.objects_accepted += 1
        elif kind == "unsubscribe":
            ended = self.active.pop(rid)
        elif kind == "snapshot":
            self.snapshot_ids.add(rid)
        else:
            self.subscription_ids.add(rid)
            self.active[rid] = placement
        if self.journal is not None:
            self.journal.append((kind, rid, placement))
        return ended

    def accept_subscriptions(self, changes: Sequence[tuple[str, str, Any]]) -> tuple[dict[int, Rejection], list[Any]]:
        """Check and accept a batch's ``(kind, id, placement)`` subscribes and unsubscribes, in stream order.

        What :meth:`check`, then :meth:`accept_id` if it passes, of each in
        turn does (journal included), in one pass of set and dict operations.
        ``kind`` is ``subscribe`` or ``unsubscribe`` (whose placement is not
        read). Returns ``index -> (reason, message)`` of the changes
        rejected, and the placements the accepted unsubscribes end, in their
        order. O(changes).
        """
        active, accepted, journal = self.active, self.subscription_ids, self.journal
        rejections: dict[int, Rejection] = {}
        ended = []
        for k, (kind, rid, placement) in enumerate(changes):
            if kind == "subscribe":
                if rid in accepted:
                    rejections[k] = _duplicate_subscription(rid)
                    continue
                accepted.add(rid)
                active[rid] = placement
            else:
                if rid not in active:
                    rejections[k] = _unknown_subscription(rid)
                    continue
                ended.append(active.pop(rid))
                placement = None
            if journal is not None:
                journal.append((kind, rid, placement))
        return rejections, ended

    def place(self, rid: str, placement: Any) -> Any:
        """Give active subscription ``rid`` a new placement (a rebalancing moved it); return the old one.

        Journaled as a ``place`` change. Raises KeyError if ``rid`` is not active.
        """
        old = self.active[rid]
        self.active[rid] = placement
        if self.journal is not None:
            self.journal.append(("place", rid, placement))
        return old


def kind_of(record: Record) -> str:
    """Return the registry kind of ``record``: one of :data:`KINDS`."""
    if isinstance(record, ObjectRecord):
        return "object"
    if isinstance(record, Unsubscribe):
        return "unsubscribe"
    if isinstance(record, SnapshotMarker):
        return "snapshot"
    return "subscribe"


def _duplicate_subscription(rid: str) -> Rejection:
    return "duplicate_id", f"subscription id {_show(rid)} was already accepted"


def _unknown_subscription(rid: str) -> Rejection:
    return "unknown_id", f"no active subscription {_show(rid)}"


def _duplicate_object(oid: str, horizon: int) -> Rejection:
    return "duplicate_id", f"object id {_show(oid)} is among the last {horizon} accepted"


def _horizon(raw: Any, capacity: int, hashes: bytes | memoryview | None) -> ObjectIdHorizon:
    """Return the object-id horizon of a durable registry: its hashes, or its ids in order (older checkpoints)."""
    if isinstance(raw, list) and hashes is None:
        horizon = ObjectIdHorizon(capacity)
        horizon.add([_string(oid) for oid in raw])
        return horizon
    return ObjectIdHorizon.from_json(raw, capacity, hashes)


def _clock(value: Any) -> float | None:
    """Return a durable watermark: None or a finite float."""
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"a watermark is a finite number or null, not {value!r}")
    return float(value)


def _show(rid: str) -> str:
    """Return an id as shown in a message, shortened (ids may be megabytes long)."""
    return clip(repr(rid))


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string id, got {type(value).__name__}")
    return value
