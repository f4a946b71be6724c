"""Which terms each evaluator's window store may hold: where a top-k or kNN subscription must live.

A topk or knn subscription's result holds only objects that share a keyword
with it (SEMANTICS sections 3.2 and 3.3), and an evaluator's local result is
made of the objects its window store holds. So evaluator ``e`` needs
subscription ``s`` only while its window store holds, or is about to
receive, an object with one of ``s``'s keywords: elsewhere ``s``'s local
result is the empty one the merge assumes. This is DSkype's keyword-based
distribution (Skype paper, section 7.3.3) turned around, with its lazy
reallocation (section 7.3.4): the objects stay where space puts them, and a
subscription follows the keywords of the objects, sent to an evaluator just
before the first object it may need arrives there.

:class:`TermPresence` keeps, per evaluator, each term's *last value*: with a
count window the number (0-based) of the last accepted object with that term
routed there, with a seconds window the largest time of such an object. A
term is *present* at ``e`` while that object may still be in the window at
the clock (:class:`~skpub.evaluators.window.WindowStore` ``holds``, without
``expires_at``, which only makes objects leave sooner): an
over-approximation of the terms the store holds, which is all exactness
needs (DESIGN "Top-k and kNN", point 2). Forgetting a term that is no longer
present changes nothing, so pruning is invisible and is not journaled.

Window ``none`` keeps objects as long as a subscription can see them, so
there the sequencer sends every ranked subscription everywhere and this
class is not used.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from skpub.kernel.config import Window

PRUNE_SLACK = 4096
"""Entries an evaluator's map may grow by beyond twice its size after the last prune before it is pruned again."""


class TermPresence:
    """Per evaluator, each term's last value; which terms are present at a clock.

    Parameters
    ----------
    evaluators : int
        Number of evaluators.
    window : Window
        A count or seconds window (its ``size`` in objects or seconds).

    Memory: O(evaluators x distinct terms of the objects the window may
    hold), at most twice that plus :data:`PRUNE_SLACK` per evaluator between
    prunes (:meth:`prune`).

    Raises
    ------
    ValueError
        If the window is ``none``.
    """

    def __init__(self, evaluators: int, window: Window) -> None:
        if window.kind not in ("count", "seconds"):
            raise ValueError(f"term presence needs a count or seconds window, not {window.kind!r}")
        self.window = window
        self.last: list[dict[str, float]] = [{} for _ in range(evaluators)]
        self._pruned_sizes = [0] * evaluators

    def cut(self, accepted: int, watermark: float) -> float:
        """Return the value a present term's last value exceeds at the clock ``(accepted, watermark)``.

        Count window of ``W`` objects: object number ``n`` is held while
        ``n >= accepted - W``; seconds window of ``T`` s: an object of time
        ``ts`` while ``ts > watermark - T`` (every term is present before the
        first watermark, NaN).
        """
        if self.window.kind == "count":
            return accepted - self.window.size - 1
        return -math.inf if math.isnan(watermark) else watermark - self.window.size

    def holders(self, terms: Collection[str], cut: float) -> list[int]:
        """Return the evaluators where one of ``terms`` is present (``cut`` from :meth:`cut`), ascending.

        O(evaluators x len(terms)): it runs once per ranked subscribe.
        """
        out = []
        for e, last in enumerate(self.last):
            for t in terms:
                if last.get(t, -math.inf) > cut:
                    out.append(e)
                    break
        return out

    def absent(self, evaluator: int, terms: Iterable[str], cut: float) -> list[str]:
        """Return those of ``terms`` that are not present at ``evaluator``. O(len(terms))."""
        last = self.last[evaluator]
        return [t for t in terms if not last.get(t, -math.inf) > cut]

    def observe(self, arrivals: Sequence[dict[str, float]]) -> None:
        """Take in one batch's arrivals: ``arrivals[e]`` maps a term to its largest value among its objects at ``e``.

        Values only grow (the largest is kept), so applying the same
        arrivals again, as a journal replay does, gives the same state.
        O(terms arriving).
        """
        for last, batch in zip(self.last, arrivals, strict=True):
            if self.window.kind == "count":
                last.update(batch)  # object numbers grow along the stream
            else:
                for term, value in batch.items():
                    if value > last.get(term, -math.inf):
                        last[term] = value

    def prune(self, accepted: int, watermark: float) -> None:
        """Forget the terms no longer present at the clock, for an evaluator whose map doubled since its last prune.

        Amortized O(1) per entry added.
        """
        cut = self.cut(accepted, watermark)
        for e, last in enumerate(self.last):
            if len(last) > 2 * self._pruned_sizes[e] + PRUNE_SLACK:
                self.last[e] = {t: v for t, v in last.items() if v > cut}
                self._pruned_sizes[e] = len(self.last[e])

    def to_json(self) -> list[dict[str, float]]:
        """Return the per-evaluator maps, the durable form (JSON: term -> number or time)."""
        return self.last

    @classmethod
    def from_json(cls, raw: object, evaluators: int, window: Window) -> TermPresence:
        """Rebuild from :meth:`to_json` output.

        Raises
        ------
        TypeError, ValueError
            If ``raw`` is not a list of ``evaluators`` maps from strings to numbers.
        """
        presence = cls(evaluators, window)
        presence.observe(check_arrivals(raw, evaluators))
        return presence


def check_arrivals(raw: object, evaluators: int) -> list[dict[str, float]]:
    """Return ``raw`` if it is a list of ``evaluators`` maps from term strings to numbers (loaded JSON).

    Raises
    ------
    TypeError, ValueError
        If it is not.
    """
    if not isinstance(raw, list) or len(raw) != evaluators:
        raise ValueError(f"term presence is a list of {evaluators} maps")
    for batch in raw:
        if not isinstance(batch, dict):
            raise TypeError("term presence maps a term to a number")
        if not all(type(v) in (int, float) for v in batch.values()):
            raise TypeError("term presence maps a term to a number")
    return raw
