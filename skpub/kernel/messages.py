"""The typed messages that cross layers: router -> evaluators -> sink.

They live in the kernel so that :mod:`skpub.router` and
:mod:`skpub.evaluators` share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from skpub.kernel.grid import CellBox
from skpub.kernel.records import DeadLetter, Record

Delivery = tuple[int, str, str]
"""``(object position, subscription id, object id)``: one range match."""


@dataclass(frozen=True, slots=True)
class Routed:
    """One record sent to one evaluator.

    ``cells`` is the object's cell as ``(cx, cy, cx, cy)``, or a range
    subscription's rectangle ∩ partition as an inclusive cell box; None for
    other records.
    """

    evaluator: int
    record: Record | DeadLetter
    cells: CellBox | None = None
