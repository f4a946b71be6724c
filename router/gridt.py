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
  there (:func:`object_routes`), with the set of those terms: the evaluator
  delivers a subscription the object matches only when the least key among
  the clauses it satisfies is one of them (GI^2's restricted match,
  :meth:`skpub.evaluators.gi2.GI2Index.match_one`), so a (subscription,
  object) pair is delivered once wherever the subscription's clauses went;
- the rectangle's *primary* evaluator, its first, also receives every object
  there that a window store needs (DESIGN "Top-k and kNN": ranked work counts
  an object at one evaluator), even when no term sends it there.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from skpub.router.errors import RoutingError


def stable_hash(term: str) -> int:
    """Return CRC-32 of the term's UTF-8 bytes: the same in every process (unlike ``hash``)."""
    return zlib.crc32(term.encode("utf-8", "surrogatepass"))


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
        ``sorted(evaluators)[crc32(term) % len(evaluators)]``: rectangles
        with the same evaluators and assignments send a term to the same
        evaluator whatever their primaries.

    Raises
    ------
    RoutingError
        If ``evaluators`` is empty or repeats one, or a term is assigned elsewhere.
    """

    evaluators: tuple[int, ...]
    assigned: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        evaluators = tuple(int(e) for e in self.evaluators)
        if not evaluators or len(set(evaluators)) != len(evaluators) or min(evaluators) < 0:
            raise RoutingError(f"a term table needs distinct evaluators, got {evaluators}")
        members = set(evaluators)
        if any(e not in members for e in self.assigned.values()):
            raise RoutingError("a term table assigns a term to an evaluator outside the rectangle")
        object.__setattr__(self, "evaluators", evaluators)
        object.__setattr__(self, "assigned", dict(self.assigned))
        object.__setattr__(self, "_ring", tuple(sorted(evaluators)))

    @property
    def primary(self) -> int:
        """The evaluator that keeps the rectangle's window objects."""
        return self.evaluators[0]

    def evaluator_of(self, term: str) -> int:
        """Return the evaluator responsible for ``term`` in this rectangle; O(len(term))."""
        e = self.assigned.get(term)
        return e if e is not None else self._ring[stable_hash(term) % len(self._ring)]

    def to_json(self) -> dict:
        """Return ``{"evaluators": [...], "assigned": {term: evaluator}}`` (terms sorted)."""
        return {"evaluators": list(self.evaluators), "assigned": dict(sorted(self.assigned.items()))}

    @classmethod
    def from_json(cls, raw: Mapping) -> TermTable:
        """Rebuild a table from :meth:`to_json` output.

        Raises
        ------
        RoutingError
            If the document is not a term table.
        """
        try:
            assigned = {str(t): int(e) for t, e in raw["assigned"].items()}
            return cls(tuple(int(e) for e in raw["evaluators"]), assigned)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RoutingError(f"damaged term table: {exc}") from None


def subscription_evaluators(table: TermTable, keys: Iterable[str]) -> set[int]:
    """Return the evaluators a range subscription with clause keys ``keys`` goes to in the rectangle."""
    return {table.evaluator_of(k) for k in keys}


def object_routes(
    table: TermTable, terms: Iterable[str], held: Sequence[Mapping[str, int]] | None = None
) -> dict[int, frozenset[str]]:
    """Return ``evaluator -> terms it is responsible for`` for an object in the rectangle.

    Parameters
    ----------
    table : TermTable
    terms : iterable of str
        The object's terms.
    held : sequence of mappings, optional
        ``held[e]``: the keys of the subscriptions evaluator ``e`` holds (the textual
        summaries' counts): a term goes to its evaluator only when held
        there (grid^t's H2: an object no subscription term can match is not
        sent). None sends every term.

    Returns
    -------
    dict
        Evaluators with at least one responsible term; O(terms).
    """
    out: dict[int, set[str]] = {}
    for t in terms:
        e = table.evaluator_of(t)
        if held is None or t in held[e]:
            out.setdefault(e, set()).add(t)
    return {e: frozenset(ts) for e, ts in out.items()}
