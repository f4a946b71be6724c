"""PS2Stream V-A phase I: split a loaded rectangle by text, or take an evaluator out of a text-partitioned one.

PS2Stream's local load adjustment first looks at the ``p`` most loaded cells
of the most loaded worker ``w_o``: a cell partitioned by space may be
partitioned by text into two, one of which goes to the least loaded worker
``w_l``; a text-partitioned cell that ``w_l`` shares may go to ``w_l``
whole, merged into one space cell. Phase II (GR's migration,
:mod:`skpub.balancer.migration`) follows if the constraint still holds.

In skpub the unit is a rectangle of the partitioning, and the operations
are two kinds of :class:`~skpub.kernel.transfer.Move`:

- ``text_split``: a plain rectangle of ``w_o`` becomes text-partitioned
  between ``w_o`` (its primary, which keeps the window objects) and ``w_l``,
  its terms split by :class:`~skpub.router.gridt.TermTable`'s stable hash (no
  sample is at hand between batches; PS2Stream splits by term too). ``w_o``
  hands ``w_l`` the subscriptions over the rectangle with a key that ``w_l``
  now answers for, and keeps all of its own: a copy whose keys all went to
  ``w_l`` delivers nothing more at ``w_o`` (GI^2's restricted match,
  :meth:`~skpub.evaluators.gi2.GI2Index.match_many`), so nothing is dropped.
  The estimate: half of the rectangle's decayed cost and subscriptions move.
- ``text_merge``: an evaluator leaves a text-partitioned rectangle, its
  terms to another of the rectangle's evaluators: a rectangle of two becomes
  plain, owned by the one that stays; of more, it keeps its other
  evaluators, ``target`` answering for the leaving one's assigned terms and
  ring slots (:meth:`~skpub.router.gridt.TermTable.without`: no other
  evaluator's terms move). The one that leaves hands ``target`` every
  subscription it holds over the rectangle, and its cost there.

The balancer's phase I splits by text only a rectangle whose load no move
of cells can spread (:func:`concentrated`): a text rectangle is frozen for
every later shift, split/merge and migration (only phase I changes it), so
splitting a wide one by text leaves the next hot spot inside it to two
evaluators for good. PS2Stream's phase I works on the cells of its
kd^t-tree, not on an evaluator's whole region.

A merge is what lets the balancer act inside the kd^t-tree's text
rectangles (of the whole space, when it cuts the root by text): the
costliest evaluator leaves one it shares with a light one. Window objects
never move (DESIGN "The balancer"): after a merge the leaving primary keeps
the ones it accepted until they leave the window.
"""

from __future__ import annotations

import numpy as np

from skpub.balancer.operation import Loads, Operation
from skpub.kernel.load import RectangleLoad
from skpub.kernel.transfer import Move
from skpub.router.partitioning import Partitioning

LOADED_RECTANGLES = 3
"""PS2Stream's ``p``: how many of the most loaded evaluator's costliest plain rectangles phase I tries to split."""

CONCENTRATED = 0.75
"""A rectangle's load is concentrated when every cut between its lines leaves one side more than this share of it."""


def concentrated(load: RectangleLoad | None) -> bool:
    """Return whether every cut of the rectangle between two rows or columns leaves one side over :data:`CONCENTRATED`.

    Of its cost, that is: no single cut of cells halves the rectangle's
    load, so no shift, split/merge or migration of cells can spread it
    much, while a text split (PS2Stream V-A phase I) halves it whatever its
    place. A hot cell or a venue, not a hot region of several cells: an
    evenly hot 2 x 2 block is cut in halves and is not concentrated. False
    for a missing load (no summary), for a rectangle without cost (nothing
    to spread) and for a cost that is not a finite positive number; True for
    a rectangle of one cell with cost. O(w + h) from the row and column
    aggregates (Tornado 4.3).
    """
    if load is None:
        return False
    cost = load.cost
    if not (np.isfinite(cost) and cost > 0):
        return False
    for lines in (load.columns, load.rows):
        before = np.cumsum(lines)[:-1]
        if len(before) and float(np.min(np.maximum(before, cost - before))) <= CONCENTRATED * cost:
            return False
    return True


def text_split(partitioning: Partitioning, loads: Loads, rect: int, target: int) -> Operation:
    """Weigh splitting plain rectangle ``rect`` by text between its owner and ``target``.

    Half of the owner's decayed cost and subscriptions over the rectangle move
    (the terms split by a hash); C_r and C_t as for every operation
    (Tornado Eqs 4-5, :meth:`Loads.operation`).
    """
    box = tuple(partitioning.boxes[rect].tolist())
    source = int(partitioning.owners[rect])
    cost, queries = loads.member_load(source, box)
    return loads.operation("text_split", [Move(box, source, target, cost / 2, queries // 2, "split")])


def text_merge(
    partitioning: Partitioning, loads: Loads, rect: int, source: int, target: int | None = None
) -> Operation:
    """Weigh ``source`` leaving text rectangle ``rect``, its terms and load there to ``target``.

    ``target`` is another evaluator of the rectangle; None names the other
    one of a two-evaluator rectangle.

    Raises
    ------
    ValueError
        If ``target`` is None and the rectangle has more than two evaluators.
    """
    box = tuple(partitioning.boxes[rect].tolist())
    if target is None:
        (target,) = (e for e in partitioning.texts[rect].evaluators if e != source)
    cost, queries = loads.member_load(source, box)
    return loads.operation("text_merge", [Move(box, source, target, cost, queries, "merge")])


def splittable(partitioning: Partitioning, rect: int) -> bool:
    """Return whether rectangle ``rect`` is plain (a text split's candidate)."""
    return partitioning.texts[rect] is None


def mergeable(partitioning: Partitioning, rect: int, source: int) -> bool:
    """Return whether ``source`` may leave text rectangle ``rect`` by a merge.

    ``source`` must be one of the rectangle's two evaluators or more and
    hold another rectangle (primary or not, it would otherwise hold
    nothing). O(rectangles).
    """
    table = partitioning.texts[rect]
    if table is None or len(table.evaluators) < 2 or source not in table.evaluators:
        return False
    return len(partitioning.boxes_of(source)) > 1


def phase_one(partitioning: Partitioning, loads: Loads, source: int, targets: list[int]) -> list[Operation]:
    """Return phase I's candidates for the costliest evaluator ``source`` and the least loaded of ``targets``.

    Splits of ``source``'s :data:`LOADED_RECTANGLES` costliest plain
    rectangles whose load is :func:`concentrated` (a wide rectangle split
    by text would be frozen for every later move of cells) towards the least
    loaded target, and merges of the text rectangles ``source`` shares with
    any of ``targets``, into the least loaded of those it shares each with.
    O(rectangles log rectangles + text rectangles x rectangles).
    """
    if not targets:
        return []
    lightest = min(targets, key=lambda e: (loads.costs[e], e))
    box = partitioning.boxes
    owned = [
        i
        for i, o in enumerate(partitioning.owners.tolist())
        if o == source
        and splittable(partitioning, i)
        and concentrated(loads.members.get((source, tuple(box[i].tolist()))))
    ]
    owned.sort(key=lambda i: (-loads.member_load(source, tuple(box[i].tolist()))[0], i))
    out = [text_split(partitioning, loads, i, lightest) for i in owned[:LOADED_RECTANGLES]]
    for i, table in enumerate(partitioning.texts):
        if table is not None and mergeable(partitioning, i, source):
            shared = [e for e in table.evaluators if e != source and e in targets]
            if shared:
                target = min(shared, key=lambda e: (loads.costs[e], e))
                out.append(text_merge(partitioning, loads, i, source, target))
    return out
