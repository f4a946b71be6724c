"""The typed messages that cross layers: router -> evaluators -> sink.

They live in the kernel so that :mod:`skpub.router` and
:mod:`skpub.evaluators` share them without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skpub.kernel.grid import CellBox
from skpub.kernel.records import DeadLetter, Record

Delivery = tuple[int, str, str]
"""``(object position, subscription id, object id)``: one range match."""


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
