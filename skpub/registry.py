"""The id registry: the validation that depends on the stream so far.

``duplicate_id`` and ``unknown_id`` of SEMANTICS section 1 cannot be decided
from one line: they need every id accepted before. :class:`IdRegistry` keeps
those ids per record type, and the active subscriptions with a *placement*
chosen by its owner (the router stores where a subscription lives, so its
unsubscribe reaches the same evaluators).

Until the topk/knn evaluators land, a valid topk or knn subscription is
rejected with ``unsupported_kind`` (a documented extension of the reason
table, see ``docs/SEMANTICS.md``), so it is neither lost nor silently ignored.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from skpub.records import (
    DeadLetter,
    ObjectRecord,
    RangeSubscription,
    Record,
    SnapshotMarker,
    Unsubscribe,
)

SUPPORTED_SUBSCRIPTIONS = (RangeSubscription,)

Change = tuple[str, str, Any]
"""One accepted change: ``(type, id, placement)`` with type object, subscribe, unsubscribe or snapshot."""


@dataclass
class IdRegistry:
    """Ids accepted so far, per type, and the active subscriptions' placements.

    Memory is O(ids ever accepted): SEMANTICS requires ids to be unique for the
    whole stream.

    With ``journal`` a list, every accepted change is also appended there, so
    an engine can persist one micro-batch's changes (O(batch)) instead of the
    whole registry (O(stream)); :meth:`replay` applies them again.
    """

    object_ids: set[str] = field(default_factory=set)
    subscription_ids: set[str] = field(default_factory=set)
    snapshot_ids: set[str] = field(default_factory=set)
    active: dict[str, Any] = field(default_factory=dict)
    journal: list[Change] | None = None

    def snapshot_bytes(self) -> bytes:
        """Return the registry (without its journal) as picklable bytes."""
        state = (self.object_ids, self.subscription_ids, self.snapshot_ids, self.active)
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_snapshot(cls, data: bytes) -> IdRegistry:
        """Rebuild a registry from :meth:`snapshot_bytes`."""
        return cls(*pickle.loads(data))

    def take_journal(self) -> list[Change]:
        """Return the changes journaled since the last call and start a new journal."""
        changes, self.journal = self.journal or [], []
        return changes

    def replay(self, changes: Iterable[Change]) -> None:
        """Apply journaled changes, in order (not journaled again)."""
        for rtype, rid, placement in changes:
            if rtype == "object":
                self.object_ids.add(rid)
            elif rtype == "subscribe":
                self.subscription_ids.add(rid)
                self.active[rid] = placement
            elif rtype == "unsubscribe":
                del self.active[rid]
            else:
                self.snapshot_ids.add(rid)

    def rejection(self, record: Record, line: str) -> DeadLetter | None:
        """Return the dead letter for ``record`` if the stream so far rejects it, else None.

        Does not change the registry; call :meth:`accept` for accepted records.
        """
        pos = record.pos
        if isinstance(record, ObjectRecord):
            if record.id in self.object_ids:
                return DeadLetter(pos, line, "duplicate_id", f"object id {record.id!r} was already accepted")
        elif isinstance(record, Unsubscribe):
            if record.id not in self.active:
                return DeadLetter(pos, line, "unknown_id", f"no active subscription {record.id!r}")
        elif isinstance(record, SnapshotMarker):
            if record.id in self.snapshot_ids:
                return DeadLetter(pos, line, "duplicate_id", f"snapshot id {record.id!r} was already accepted")
        elif record.id in self.subscription_ids:
            return DeadLetter(pos, line, "duplicate_id", f"subscription id {record.id!r} was already accepted")
        elif not isinstance(record, SUPPORTED_SUBSCRIPTIONS):
            return DeadLetter(pos, line, "unsupported_kind", "this version evaluates range subscriptions only")
        return None

    def accept(self, record: Record, placement: Any = None) -> Any:
        """Record an accepted record; for an unsubscribe, return the placement it ends."""
        ended = None
        if isinstance(record, ObjectRecord):
            self.object_ids.add(record.id)
            rtype = "object"
        elif isinstance(record, Unsubscribe):
            ended = self.active.pop(record.id)
            rtype = "unsubscribe"
        elif isinstance(record, SnapshotMarker):
            self.snapshot_ids.add(record.id)
            rtype = "snapshot"
        else:
            self.subscription_ids.add(record.id)
            self.active[record.id] = placement
            rtype = "subscribe"
        if self.journal is not None:
            self.journal.append((rtype, record.id, placement))
        return ended
