"""The serial stage of routing: what depends on stream order, and nothing else.

The :class:`Sequencer` holds the routing unit's state: the id registry
(duplicate and unknown ids, the object-id horizon, the numbering of accepted
objects), the placements of active subscriptions (where each lives, so its
unsubscribe reaches the same evaluators) and the textual summaries (Tornado
section 3.1: an object is forwarded to its owner only if one of its terms is
a summary keyword there). Parsing and locating ran before, in parallel
(:mod:`skpub.router.locate`); the sequencer sees only compact columns: the
kind, id, owner evaluator and terms of every record, and the targets and
summary keywords of subscriptions. Its cost per object is a few dictionary
and set operations.

Its state changes only through :meth:`Sequencer.sequence`; the registry
(with its placements) is the durable part, and the summaries are rebuilt
from the placements when a sequencer is built from a registry.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from skpub.kernel.decode import clip
from skpub.kernel.grid import CellBox
from skpub.kernel.registry import IdRegistry
from skpub.router.locate import Located
from skpub.router.summary import TextualSummaries

Targets = tuple[tuple[int, CellBox], ...]
"""A range subscription's ``(evaluator, cell box)`` pairs."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an active subscription lives: its evaluators and summary keywords."""

    evaluators: tuple[int, ...]
    keywords: frozenset[str]

    def to_json(self) -> list:
        """Return ``[evaluators, sorted keywords]``, the durable form."""
        return [list(self.evaluators), sorted(self.keywords)]

    @classmethod
    def from_json(cls, raw: list) -> Placement:
        """Rebuild a placement from :meth:`to_json`.

        Raises
        ------
        TypeError, ValueError
            If ``raw`` is not of that shape.
        """
        evaluators, keywords = raw
        if not all(type(e) is int for e in evaluators) or not all(type(k) is str for k in keywords):
            raise TypeError("a placement is [[evaluator ints], [keyword strings]]")
        return cls(tuple(evaluators), frozenset(keywords))


@dataclass
class Decisions:
    """What the sequencer decided for one micro-batch.

    Row ``r`` sends item ``index[r]`` to ``evaluator[r]``, in stream order;
    ``box[r]`` is a subscription's cell box there (None: the item's own cells,
    an object's cell or nothing). ``rejected`` holds ``(item, reason,
    message)`` for records the stream so far rejects (``duplicate_id``,
    ``unknown_id``, ``unsupported_kind``) and for items that failed
    (``internal_error``).
    """

    index: list[int] = field(default_factory=list)
    evaluator: list[int] = field(default_factory=list)
    box: list[CellBox | None] = field(default_factory=list)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)
    objects: int = 0
    forwarded: int = 0
    cpu_seconds: float = 0.0


class Sequencer:
    """The routing unit's serial state: id registry, placements, textual summaries."""

    def __init__(self, evaluators: int, registry: IdRegistry) -> None:
        self.registry = registry
        self.summaries = TextualSummaries(evaluators)
        for placement in registry.active.values():
            for e in placement.evaluators:
                self.summaries.add(e, placement.keywords)

    def sequence(
        self,
        kinds: Sequence[str],
        ids: Sequence[str],
        owners: Sequence[int],
        terms: Sequence[Collection[str] | None],
        subscriptions: Mapping[int, tuple[Targets, frozenset[str]]],
    ) -> Decisions:
        """Decide one micro-batch, given its records' compact columns in stream order.

        Parameters
        ----------
        kinds, ids : sequence of str
            Registry kind (:data:`skpub.kernel.registry.KINDS`) and id of item ``i``.
        owners : sequence of int
            An object's owner evaluator (ignored for other kinds).
        terms : sequence
            An object's terms (any collection of str; None for other kinds).
        subscriptions : mapping
            ``item -> (targets, summary keywords)`` for every ``subscribe`` item.

        Returns
        -------
        Decisions
            O(1) per object (amortized dictionary and set operations), O(targets)
            per subscription. Never raises for an item: one that fails becomes
            an ``internal_error`` rejection and leaves the state as it was.
        """
        start = time.thread_time()
        out = Decisions()
        index, evaluator, box, rejected = out.index, out.evaluator, out.box, out.rejected
        registry, counts = self.registry, self.summaries.counts
        object_ids, accept = registry.object_ids, registry.accept_id
        for i, kind in enumerate(kinds):
            try:
                if kind == "object":
                    oid = ids[i]
                    if oid in object_ids:
                        rejected.append((i, *registry.check(kind, oid)))
                        continue
                    e = owners[i]
                    admitted = not counts[e].keys().isdisjoint(terms[i])
                    accept(kind, oid)
                    out.objects += 1
                    if admitted:
                        index.append(i)
                        evaluator.append(e)
                        box.append(None)
                        out.forwarded += 1
                    continue
                rejection = registry.check(kind, ids[i])
                if rejection is not None:
                    rejected.append((i, *rejection))
                elif kind == "subscribe":
                    targets, keywords = subscriptions[i]
                    placement = Placement(tuple(e for e, _ in targets), keywords)
                    accept(kind, ids[i], placement)
                    for e, cells in targets:
                        self.summaries.add(e, keywords)
                        index.append(i)
                        evaluator.append(e)
                        box.append(cells)
                elif kind == "unsubscribe":
                    placement = accept(kind, ids[i])
                    for e in placement.evaluators:
                        self.summaries.remove(e, placement.keywords)
                        index.append(i)
                        evaluator.append(e)
                        box.append(None)
                else:
                    accept(kind, ids[i])
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                rejected.append((i, "internal_error", clip(f"{type(exc).__name__}: {exc}", 500)))
        out.cpu_seconds = time.thread_time() - start
        return out

    def sequence_located(self, items: Sequence[Located]) -> Decisions:
        """:meth:`sequence` for records located in this process."""
        return self.sequence(
            [it.kind for it in items],
            [it.record.id for it in items],
            [it.evaluator for it in items],
            [it.record.term_set if it.kind == "object" else None for it in items],
            {i: (it.targets, it.keywords) for i, it in enumerate(items) if it.kind == "subscribe"},
        )
