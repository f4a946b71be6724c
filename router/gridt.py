"""grid^t's term tables: where a text-partitioned rectangle sends each term (PS2Stream section IV-C).

A *text-partitioned* rectangle of a :class:`~skpub.router.partitioning.Partitioning`
(a leaf of the kd^t-tree that Algorithm 1 partitions by text) is shared by
several evaluators, each responsible for a subset of the terms. Its
:class:`TermTable` is grid^t's H1 for the rectangle's cells: a term's
evaluator is the one the kd^t-tree assigned it to, and any other term's a
stable hash of it over the rectangle's evaluators (so a term first seen
after partitioning has an evaluator too, the same on every routing unit and
in every process). H2, the subscription terms held per evaluator, is the
routing unit's textual summaries (:mod:`skpub.router.summary`).

Routing through a text-partitioned rectangle (PS2Stream IV-C; DESIGN
"Text partitions"):

- a range subscription goes, for each DNF clause, to the evaluator of the
  clause's least frequent keyword (its *key*; an AND subscription has one);
- an object goes to the evaluator of each of its terms that is a key held
  there (:func:`route_objects`), with the set of those terms: the evaluator
  delivers a subscription the object matches only when the least key among
  the clauses it satisfies is one of them (GI^2's restricted match,
  :meth:`skpub.evaluators.gi2.GI2Index.match_many`), so a (subscription,
  object) pair is delivered once wherever the subscription's clauses went;
- the rectangle's *primary* evaluator, its first, also receives every object
  there that a window store needs (DESIGN "Top-k and kNN": ranked work counts
  an object at one evaluator), even when no term sends it there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from skpub.kernel.decode import exact_int
from skpub.kernel.text import hashed_evaluator
from skpub.router.errors import RoutingError
from skpub.router.summary import terms_among

MEMO_TERMS = 1 << 18
"""Terms a :class:`TermTable` remembers the evaluator of (then it forgets them all): bounds its memory."""


@dataclass(frozen=True)
class TermTable:
    """H1 of one text-partitioned rectangle: term -> evaluator.

    Attributes
    ----------
    evaluators : tuple of int
        The rectangle's evaluators, distinct, at least one; the first is the
        primary (it receives the objects a window store needs).
    assigned : mapping of str to int
        Terms placed by the partitioning (the kd^t-tree's term subsets);
        every value is one of ``evaluators``. Any other term goes to
        ``ring[crc32(term) % len(ring)]``: rectangles with the same ring and
        assignments send a term to the same evaluator whatever their
        primaries.
    ring : tuple of int, optional
        The slots a term without an assignment is hashed over; by default
        ``sorted(evaluators)``. It names every evaluator and only those, and
        may name one several times: when an evaluator leaves a rectangle
        (:meth:`without`) its slots go to the one that takes its terms, so
        no other evaluator's hashed terms move.

    Raises
    ------
    RoutingError
        If ``evaluators`` is empty or repeats one, a term is assigned
        elsewhere, or ``ring`` does not name exactly the evaluators.
    """

    evaluators: tuple[int, ...]
    assigned: Mapping[str, int] = field(default_factory=dict)
    ring: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        evaluators = tuple(int(e) for e in self.evaluators)
        if not evaluators or len(set(evaluators)) != len(evaluators) or min(evaluators) < 0:
            raise RoutingError(f"a term table needs distinct evaluators, got {evaluators}")
        members = set(evaluators)
        if any(e not in members for e in self.assigned.values()):
            raise RoutingError("a term table assigns a term to an evaluator outside the rectangle")
        ring = tuple(int(e) for e in self.ring) or tuple(sorted(evaluators))
        if set(ring) != members:
            raise RoutingError(f"a term table's ring {ring} must name exactly its evaluators {evaluators}")
        object.__setattr__(self, "evaluators", evaluators)
        object.__setattr__(self, "assigned", dict(self.assigned))
        object.__setattr__(self, "ring", ring)
        object.__setattr__(self, "_memo", {})  # term -> evaluator: a pure function's cache, at most MEMO_TERMS

    @property
    def primary(self) -> int:
        """The evaluator that keeps the rectangle's window objects."""
        return self.evaluators[0]

    def evaluator_of(self, term: str) -> int:
        """Return the evaluator responsible for ``term`` in this rectangle; O(len(term)), O(1) when seen lately."""
        memo = self._memo
        e = memo.get(term)
        if e is None:
            e = self.assigned.get(term)
            if e is None:
                e = hashed_evaluator(term, self.ring)
            if len(memo) >= MEMO_TERMS:
                memo.clear()
            memo[term] = e
        return e

    def evaluators_of(self, terms: Sequence[str]) -> np.ndarray:
        """Vectorized :meth:`evaluator_of`: shape ``(len(terms),)``, int64; one dict lookup per term seen lately."""
        memo = self._memo
        found = [memo.get(term, -1) for term in terms]
        out = np.fromiter(found, np.int64, len(found))
        for k in np.flatnonzero(out < 0).tolist():
            out[k] = self.evaluator_of(terms[k])
        return out

    def without(self, source: int, target: int) -> TermTable:
        """Return the table after ``source`` leaves the rectangle and ``target`` takes its terms (a text merge).

        ``source``'s assigned terms and ring slots become ``target``'s, so
        every other term keeps its evaluator; ``target`` becomes the primary
        if ``source`` was. PS2Stream V-A phase I, for a rectangle of three
        evaluators or more (of two, the merge makes the rectangle plain).
        O(assigned terms + ring).

        Raises
        ------
        RoutingError
            If ``source`` or ``target`` is not an evaluator here, they are
            the same, or the table has fewer than three evaluators.
        """
        members = self.evaluators
        if source not in members or target not in members or source == target or len(members) < 3:
            raise RoutingError(f"evaluator {source} cannot leave its terms to {target} in a table of {members}")
        kept = [e for e in members if e != source]
        if members[0] == source:
            kept = [target, *(e for e in kept if e != target)]
        return TermTable(
            tuple(kept),
            {term: target if e == source else e for term, e in self.assigned.items()},
            tuple(target if e == source else e for e in self.ring),
        )

    def to_json(self) -> dict:
        """Return ``{"evaluators": [...], "assigned": {term: evaluator}}``, and ``"ring"`` if not the default."""
        out = {"evaluators": list(self.evaluators), "assigned": dict(sorted(self.assigned.items()))}
        return out if self.ring == tuple(sorted(self.evaluators)) else {**out, "ring": list(self.ring)}

    @classmethod
    def from_json(cls, raw: Mapping) -> TermTable:
        """Rebuild a table from :meth:`to_json` output.

        Raises
        ------
        RoutingError
            If the document is not a term table.
        """
        try:
            assigned = {str(t): exact_int(e) for t, e in raw["assigned"].items()}
            ring = raw.get("ring")
            if ring is not None and not ring:
                raise ValueError("an empty ring")
            ring = () if ring is None else tuple(exact_int(e) for e in ring)
            return cls(tuple(exact_int(e) for e in raw["evaluators"]), assigned, ring)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RoutingError(f"damaged term table: {exc}") from None


def routing_classes(texts: Sequence[TermTable | None]) -> tuple[np.ndarray, tuple[TermTable, ...]]:
    """Group rectangles whose tables send every term to the same evaluator.

    Two tables route alike when they have the same ring (for default rings:
    the same evaluators in any order, the primary only keeping window
    objects) and the same assignments; the text
    baseline gives every rectangle such a table, so a batch resolves each
    term once rather than once per rectangle.

    Returns
    -------
    (classes, tables)
        ``classes`` : ndarray, shape (len(texts),), int32: rectangle ``i``'s class,
        -1 for a rectangle without a table; ``tables[c]`` is the first table
        of class ``c``. O(assigned terms log assigned terms) per table.
    """
    keys: dict[tuple, int] = {}
    tables: list[TermTable] = []
    classes = np.full(len(texts), -1, np.int32)
    for i, table in enumerate(texts):
        if table is not None:
            key = (table.ring, tuple(sorted(table.assigned.items())))
            if key not in keys:
                keys[key] = len(tables)
                tables.append(table)
            classes[i] = keys[key]
    return classes, tuple(tables)


@dataclass(frozen=True)
class TermRoutes:
    """Where grid^t sends a batch of objects in text-partitioned rectangles: one row per (object, evaluator).

    Attributes
    ----------
    objects : ndarray, shape (r,), int64
        The object (its index in the batch given to :func:`route_objects`), ascending.
    evaluators : ndarray, shape (r,), int64
        The evaluator, ascending within an object; no (object, evaluator) twice.
    terms : pyarrow.ListArray of string, length r
        The terms the evaluator answers for there: distinct, sorted.
    """

    objects: np.ndarray
    evaluators: np.ndarray
    terms: pa.ListArray


def route_objects(
    tables: Sequence[TermTable],
    classes: np.ndarray,
    terms: pa.ListArray,
    held: Sequence[Mapping[str, int]] | None = None,
    keys: pa.Array | None = None,
) -> TermRoutes:
    """Route objects in text-partitioned rectangles by their terms (grid^t's H1 and H2, PS2Stream IV-C).

    An object goes to the evaluator of each of its terms (``tables[classes[k]]``,
    :meth:`TermTable.evaluator_of`) that is a key held there, with the set of
    those terms: only a term some subscription there was routed by can send it
    (an object no subscription term can match goes nowhere).

    Parameters
    ----------
    tables : sequence of TermTable
        The rectangles' routing classes (:func:`routing_classes`).
    classes : ndarray, shape (n,), int
        Object ``k``'s class, an index into ``tables``.
    terms : pyarrow.ListArray of string, length n
        Object ``k``'s terms (nulls and repeats allowed).
    held : sequence of mappings, optional
        ``held[e]``: the keys of the subscriptions evaluator ``e`` holds (the
        textual summaries' counts). None sends every term.
    keys : pyarrow.Array of string, optional
        Every key in ``held`` (:meth:`~skpub.router.summary.TextualSummaries.key_array`);
        computed from ``held`` when None.

    Returns
    -------
    TermRoutes
        In Arrow and numpy over the objects' terms; Python work once per
        distinct (class, key term) of the batch, not per object. O(terms +
        keys held).
    """
    if held is not None and keys is None:  # few of an object's terms are keys: filter before anything runs per term
        keys = pa.array(list(set().union(*held)), terms.type.value_type)
    flat, parents, where = terms_among(terms, keys if held is not None else None)
    encoded = pc.dictionary_encode(flat.take(pa.array(where, pa.int64())))  # each distinct term looked up once
    values = encoded.dictionary
    words = values.to_pylist()
    word = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    width = max(len(words), 1)
    pairs, pair = np.unique(np.asarray(classes, np.int64)[parents] * width + word, return_inverse=True)
    evaluator_of_pair = np.empty(len(pairs), np.int64)
    pair_class = pairs // width
    first = np.ones(len(pairs), bool)  # pairs are sorted: each class's pairs are a run
    first[1:] = pair_class[1:] != pair_class[:-1]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(pairs)) if len(pairs) else starts
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        terms_here = [words[w] for w in (pairs[lo:hi] % width).tolist()]
        found = tables[int(pair_class[lo])].evaluators_of(terms_here)
        if held is not None:  # H2: only a key held where H1 sends the term
            kept = [t in held[e] for t, e in zip(terms_here, found.tolist(), strict=True)]
            found[~np.fromiter(kept, bool, len(kept))] = -1
        evaluator_of_pair[lo:hi] = found
    evaluator = evaluator_of_pair[pair.reshape(-1)]
    sent = evaluator >= 0
    objects, evaluator, word = parents[sent].astype(np.int64), evaluator[sent], word[sent]
    rank = np.empty(len(words), np.int64)
    rank[pc.array_sort_indices(values).to_numpy()] = np.arange(len(words))  # UTF-8 byte order: code point order
    order = np.lexsort((rank[word], evaluator, objects))
    objects, evaluator, word = objects[order], evaluator[order], word[order]
    fresh = np.ones(len(objects), bool)
    fresh[1:] = (objects[1:] != objects[:-1]) | (evaluator[1:] != evaluator[:-1]) | (word[1:] != word[:-1])
    objects, evaluator, word = objects[fresh], evaluator[fresh], word[fresh]
    if not len(objects):
        return TermRoutes(objects, evaluator, pa.array([], pa.list_(pa.string())))
    starts = np.flatnonzero(np.concatenate([[True], (objects[1:] != objects[:-1]) | (evaluator[1:] != evaluator[:-1])]))
    offsets = pa.array(np.append(starts, len(word)).astype(np.int32))
    values = values.take(pa.array(word)).cast(pa.string())
    return TermRoutes(objects[starts], evaluator[starts], pa.ListArray.from_arrays(offsets, values))
