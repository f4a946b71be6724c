"""The brute-force oracle: a direct replay of ``docs/SEMANTICS.md``.

Every engine's output must equal :func:`replay`. It shares only the parser
and the id registry with the engines (validation *is* the contract); matching
is done by checking every active subscription against every object, with no
index and no routing. Cost O(objects x active subscriptions) via numpy
rectangle tests; meant for tests and small replays.

Range kind only for now; topk/knn slot in as further subscription handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from skpub.kernel.config import Deployment
from skpub.kernel.records import (
    DeadLetter,
    ObjectRecord,
    RangeSubscription,
    SnapshotMarker,
    Unsubscribe,
)
from skpub.kernel.registry import IdRegistry
from skpub.kernel.text import dnf_matches


@dataclass
class OracleResult:
    """Deliveries and dead letters as the output dictionaries of SEMANTICS section 5."""

    deliveries: list[dict] = field(default_factory=list)
    dead_letters: list[dict] = field(default_factory=list)
    snapshots: list[dict] = field(default_factory=list)


@dataclass
class _RangeTable:
    """Active range subscriptions as parallel arrays; ``rects`` is (n, 4) float64."""

    ids: list[str] = field(default_factory=list)
    dnfs: list = field(default_factory=list)
    rects: np.ndarray = field(default_factory=lambda: np.empty((64, 4)))
    alive: list[bool] = field(default_factory=list)

    def add(self, sub: RangeSubscription) -> int:
        n = len(self.ids)
        if n == len(self.rects):
            self.rects = np.concatenate([self.rects, np.empty_like(self.rects)])
        self.rects[n] = sub.rect.as_list()
        self.ids.append(sub.id)
        self.dnfs.append(sub.dnf)
        self.alive.append(True)
        return n

    def matches(self, obj: ObjectRecord) -> list[str]:
        r = self.rects[: len(self.ids)]
        hits = np.flatnonzero((r[:, 0] <= obj.x) & (obj.x <= r[:, 2]) & (r[:, 1] <= obj.y) & (obj.y <= r[:, 3]))
        return [self.ids[i] for i in hits if self.alive[i] and dnf_matches(self.dnfs[i], obj.term_set)]


def replay(lines: Iterable[bytes | str], deployment: Deployment) -> OracleResult:
    """Replay a stream of input lines and return exactly what SEMANTICS says it delivers.

    ``lines`` are records without terminators, as bytes (as read) or str
    (taken as their UTF-8 encoding).
    """
    result = OracleResult()
    registry = IdRegistry(deployment.object_id_horizon)
    table = _RangeTable()
    for pos, line in enumerate(lines):
        record = registry.parse(line, pos, deployment.space, deployment.max_record_bytes)
        if isinstance(record, DeadLetter):
            result.dead_letters.append(record.to_json())
        elif isinstance(record, ObjectRecord):
            registry.accept(record)
            for sub in table.matches(record):
                result.deliveries.append({"sub": sub, "obj": record.id, "event": "match"})
        elif isinstance(record, RangeSubscription):
            registry.accept(record, table.add(record))
        elif isinstance(record, Unsubscribe):
            table.alive[registry.accept(record)] = False
        elif isinstance(record, SnapshotMarker):
            registry.accept(record)
    return result
