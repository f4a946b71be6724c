"""The typed messages that cross layers: router -> evaluators -> sink.

They live in the kernel so that :mod:`skpub.router` and
:mod:`skpub.evaluators` share them without importing each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from skpub.kernel.grid import CellBox
from skpub.kernel.records import DeadLetter, Record

Delivery = tuple[int, str, str]
"""``(object position, subscription id, object id)``: one range match."""


@dataclass
class Deliveries:
    """One evaluator's range matches of a micro-batch as columns, row ``i`` one match, in stream order.

    Attributes
    ----------
    pos : ndarray, shape (n,), int64
        The object's stream position.
    sub, obj : pyarrow string arrays (plain or dictionary-encoded), length n
        Subscription and object ids. A batch's matches repeat few ids (a
        dense batch holds millions of matches of some 10^5 subscriptions),
        so they travel dictionary-encoded where they are made, and each id
        is JSON-encoded once (:func:`skpub.kernel.parts.delivery_lines`).
    """

    pos: np.ndarray
    sub: pa.Array
    obj: pa.Array

    def __len__(self) -> int:
        return len(self.pos)

    @classmethod
    def empty(cls) -> Deliveries:
        """Return no matches."""
        return cls(np.empty(0, np.int64), pa.array([], pa.string()), pa.array([], pa.string()))

    @classmethod
    def of(cls, rows: Sequence[Delivery]) -> Deliveries:
        """Return ``(pos, sub, obj)`` tuples as columns (tests and the one-by-one fallback)."""
        return cls(
            np.array([r[0] for r in rows], dtype=np.int64),
            pa.array([r[1] for r in rows], pa.string()),
            pa.array([r[2] for r in rows], pa.string()),
        )

    @classmethod
    def concat(cls, parts: Sequence[Deliveries]) -> Deliveries:
        """Return the matches of ``parts`` one after the other."""
        if not parts:
            return cls.empty()

        def plain(array: pa.Array) -> pa.Array:
            return array.cast(pa.string()) if pa.types.is_dictionary(array.type) else array

        return cls(
            np.concatenate([p.pos for p in parts]),
            pa.concat_arrays([plain(p.sub) for p in parts]),
            pa.concat_arrays([plain(p.obj) for p in parts]),
        )

    def without(self, positions: set[int]) -> Deliveries:
        """Return the matches of objects not at ``positions``, in order; O(n) in numpy and Arrow."""
        kept = ~np.isin(self.pos, np.fromiter(positions, np.int64, len(positions)))
        mask = pa.array(kept)
        return Deliveries(self.pos[kept], self.sub.filter(mask), self.obj.filter(mask))

    def rows(self) -> list[Delivery]:
        """Return the matches as ``(pos, sub, obj)`` tuples; O(n) Python objects, for tests."""
        return list(zip(self.pos.tolist(), self.sub.to_pylist(), self.obj.to_pylist(), strict=True))


@dataclass(slots=True)
class Routed:
    """One record sent to one evaluator (not frozen: one is built per routed row, and a frozen one takes 4x longer).

    ``cells`` is the object's cell as ``(cx, cy, cx, cy)``, or a range
    subscription's rectangle ∩ partition as an inclusive cell box; None for
    other records. ``accepted`` and ``watermark`` are the stream's clock just
    after the record (SEMANTICS section 4): the number of objects accepted so
    far and the largest object time (seconds; NaN before the first object),
    which the sequencer stamps so that an evaluator keeps the global window
    while it sees only its own objects.

    An object in a text-partitioned rectangle (PS2Stream IV-C) may go to
    several evaluators: ``only`` is then the set of its terms this
    evaluator answers for (range matches are delivered only through them,
    DESIGN "Text partitions"), and ``window`` is false everywhere but at the
    rectangle's primary, which alone keeps the object for top-k/kNN. For
    every other row ``only`` is None (every term) and ``window`` true.
    """

    evaluator: int
    record: Record | DeadLetter | Mark
    cells: CellBox | None = None
    accepted: int = 0
    watermark: float = math.nan
    only: frozenset[str] | None = None
    window: bool = True


@dataclass(frozen=True, slots=True)
class Mark:
    """The end of a micro-batch at position ``pos``, sent to every evaluator that holds ranked subscriptions.

    A mark (or a snapshot) is where an evaluator reports the changes of its
    local top-k/kNN results to the merge (DESIGN "Top-k and kNN").
    """

    pos: int
    id: str = ""


@dataclass(slots=True)
class RankedUpdate:
    """One evaluator's local result of one ranked subscription, as of stream position ``pos`` (not frozen, as Routed).

    ``entries`` are ``(object id, value, g, ts, pos)`` rows (value: score or
    distance; g: the goodness, higher is better) of every local object whose
    ``g`` is at least the floor of its local k-th tie group less the band;
    ``bound`` is an upper bound on the ``g`` of every local candidate left
    out (-inf: none was). ``ended`` marks the last update, at the
    subscription's unsubscribe. ``field_name`` is ``score`` or ``dist``.
    """

    pos: int
    sub: str
    sub_pos: int
    evaluator: int
    k: int
    field_name: str
    entries: tuple[tuple[str, float, float, float, int], ...]
    bound: float
    ended: bool = False
