"""One ranked subscription's buffer at one evaluator: the k-skyband of Skype section 6 and its baselines.

The buffer keeps enough of the evaluator's window candidates that the first
k of the subscription's local result can be read from it without looking at
the window store, as long as it is *valid*; when an expiry makes it invalid
it is refilled from the store (a *re-evaluation*, Skype Algorithm 2).

Three policies decide how much to keep (Skype section 6, CkQST section 3.6):

- ``cskyband``: the cost-based k-skyband. A re-evaluation keeps every
  candidate whose goodness is at least theta, theta chosen by the cost model
  of Skype Eqs 9-13 (maintenance against re-evaluations, the buffer's size
  modelled as a lazy random walk); arrivals at or above theta enter; an
  entry dominated by k others is dropped (Skype Definition 10, Theorem 6.1).
- ``kmax``: the top-k' with k <= k' <= kmax, kmax = 3k (Yi et al., ICDE'03;
  Skype's baseline with kmax 60 for k 20): the lowest entries beyond kmax
  are dropped whatever their age.
- ``topk``: the first k only (Skype's "no skyband"): an arrival that
  beats the k-th pushes it out, and nearly every expiry of a result
  re-evaluates.

Two things differ from the papers, both because of the tie rule of
docs/SEMANTICS.md (ties within 1e-9 chain into groups ordered by time):

- *Dominance* is "ranks first in every set and leaves no earlier": p
  dominates u when ``g_p >= g_u``, ``(ts_p, pos_p) > (ts_u, pos_u)``, p's
  ``expires_at`` is no earlier and, with a count window, p arrived later.
  Objects here do not leave in arrival order (``expires_at``, seconds windows
  with late times), so "newer" alone is not enough.
- A left-out entry can still *bridge* two tie groups. So the buffer records
  what it dropped (position and goodness, while the object is in the
  window), and is valid only
  while the floor of its k-th tie group stays more than :data:`BAND` above
  it; nothing within the band of that floor is ever dropped.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from skpub.evaluators.ranked import Entry, rank

BAND = 1e-6
"""Entries within this of the k-th tie group's floor are never dropped (1000 times the tie tolerance)."""


def below(value: float, bands: int = 1) -> float:
    """Return ``value`` less ``bands`` bands: :data:`BAND`, or 4 ulps of ``value`` where that is wider.

    Far from 0 (|value| above about 2^32 coordinate units) a float cannot
    hold 1e-6, and the band must still leave room below the floor.
    """
    return value - bands * max(BAND, 4 * math.ulp(value))


SCAN_COST = 10.0
"""Cost of scoring one candidate in a re-evaluation, in buffer steps (one dominance test); Skype Eq 13's C_topk
is this times the candidates. Scoring is a sparse dot product and a distance, about ten dominance tests."""


@dataclass(slots=True)
class Skyband:
    """The buffer of one ranked subscription at one evaluator.

    ``entries`` maps object position -> :class:`Entry`; every local window
    candidate with ``g >= theta`` is held, except those dropped, whose
    positions and goodness are in ``dropped`` until they leave the window.
    ``stale`` means it must be refilled
    before it is read (a new subscription whose keywords the window store
    holds, or an invalid buffer).
    ``dominators`` counts, per entry, the entries that dominate it, and
    ``high`` holds the entries dominated by k or more (those a drop may
    take: the few kept within the band of the k-th, or covered by none);
    ``best`` caches the k highest goodness values held, ascending (None:
    rebuilt at the next arrival, after an entry among them left);
    ``ceiling`` caps the k-th goodness that drops are measured against
    (the floor of the whole candidate set, during a refill).
    """

    k: int
    policy: str
    count_window: bool
    entries: dict[int, Entry] = field(default_factory=dict)
    dominators: dict[int, int] = field(default_factory=dict)
    high: set[int] = field(default_factory=set)
    best: list[float] | None = None
    theta: float = -math.inf
    dropped: dict[int, float] = field(default_factory=dict)
    stale: bool = True
    ceiling: float = math.inf

    def _kth(self) -> float:
        """Return the k-th highest goodness held (-inf with fewer than k)."""
        if len(self.entries) < self.k:
            return -math.inf
        return heapq.nlargest(self.k, (e.g for e in self.entries.values()))[-1]

    def dominates(self, p: Entry, u: Entry) -> bool:
        """Whether ``p`` ranks before ``u`` in every set and leaves the window no earlier."""
        return (
            p.g >= u.g
            and (p.ts, p.pos) > (u.ts, u.pos)
            and p.expires_at >= u.expires_at
            and (p.pos > u.pos or not self.count_window)
        )

    def offer(self, entry: Entry) -> tuple[bool, list[int]]:
        """Offer an arriving candidate; return whether it was kept and the positions dropped for it.

        O(len(entries)) (one dominance scan, Skype section 6 "buffer
        maintenance"), plus a drop test of the entries dominated k times or
        more (``high``). A stale buffer takes nothing: its refill will.
        """
        if self.stale or entry.g < self.theta:
            return False, []
        if self.policy != "cskyband":
            self.entries[entry.pos] = entry
            return True, self._cap()
        k, count_window = self.k, self.count_window
        g, ts, pos, expires = entry.g, entry.ts, entry.pos, entry.expires_at
        best = self.best
        if best is None:
            best = self.best = sorted(heapq.nlargest(k, (e.g for e in self.entries.values())))
        kth = min(best[0] if len(best) == k else -math.inf, self.ceiling)
        # One pass: who dominates the arrival, and whom it dominates (dominates(), inlined).
        beaten, below_it = 0, []
        for e in self.entries.values():
            if e.g >= g and (e.ts, e.pos) > (ts, pos) and e.expires_at >= expires and (e.pos > pos or not count_window):
                beaten += 1
            elif (
                g >= e.g and (ts, pos) > (e.ts, e.pos) and expires >= e.expires_at and (pos > e.pos or not count_window)
            ):
                below_it.append(e.pos)
        if beaten >= k and (g < below(kth) or self._covered(entry)):
            if g < below(kth):
                self.dropped[pos] = g
            return False, []
        dominators, high = self.dominators, self.high
        for p in below_it:
            count = dominators[p] = dominators.get(p, 0) + 1
            if count == k:
                high.add(p)
        self.entries[pos] = entry
        dominators[pos] = beaten
        if beaten >= k:
            high.add(pos)
        if len(best) < k:
            bisect.insort(best, g)
        elif g > best[0]:
            del best[0]
            bisect.insort(best, g)
        kth = min(best[0] if len(best) == k else -math.inf, self.ceiling)
        if not high:
            return True, []
        edge = below(kth)
        dropped = [p for p in high if self.entries[p].g < edge or self._covered(self.entries[p])]
        for pos in dropped:
            g = self.entries.pop(pos).g
            self._forget_best(g)
            if g < edge:
                self.dropped[pos] = g
            del dominators[pos]
            high.discard(pos)
        return True, dropped

    def _forget_best(self, g: float) -> None:
        """Invalidate ``best`` when an entry of goodness ``g`` that may be among its values leaves."""
        best = self.best
        if best is not None and (len(best) < self.k or g >= best[0]):
            self.best = None

    def _covered(self, entry: Entry) -> bool:
        """Whether a held entry of exactly the same goodness dominates ``entry`` (then dropping it loses nothing).

        ``entry`` is dominated by k others, so it is in no first k; an equal
        value that stays at least as long bridges whatever it bridged. This
        keeps a group of exact ties (objects at one point, equal scores) to
        about k entries. O(len(entries)).
        """
        return any(e.g == entry.g and e.pos != entry.pos and self.dominates(e, entry) for e in self.entries.values())

    def _cap(self) -> list[int]:
        """Drop the lowest entries beyond 3k (kmax) or k (topk), never within the band of the k-th."""
        cap = 3 * self.k if self.policy == "kmax" else self.k
        if len(self.entries) <= cap:
            return []
        kth = self._kth()
        extra = len(self.entries) - cap
        lowest = heapq.nsmallest(extra, self.entries.values(), key=lambda e: e.g)
        dropped = [e.pos for e in lowest if e.g < below(kth)]
        for pos in dropped:
            self.dropped[pos] = self.entries.pop(pos).g
        return dropped

    def remove(self, pos: int) -> bool:
        """Forget the entry at ``pos`` (it left the window); return whether it was held.

        Entries it dominated leave no later, so no count changes (Skype
        section 6: "unlink in O(1)").
        """
        entry = self.entries.pop(pos, None)
        if entry is None:
            return False
        self._forget_best(entry.g)
        self.dominators.pop(pos, None)
        self.high.discard(pos)
        return True

    def read(self, alive: Callable[[int], bool] = lambda pos: True) -> tuple[list[Entry], float] | None:
        """Return what the merge needs, or None when the buffer cannot prove its first k.

        The buffer proves them when nothing was ever left out, or when it
        holds at least k entries and the floor of its k-th tie group is more
        than :data:`BAND` above everything left out (Skype Theorem 6.1,
        extended to chained ties). Then the result is the entries within
        the band of that floor, and the bound on the goodness of every local
        candidate not in it (-inf: none was left out), which the merge needs
        to prove the global first k (DESIGN "Top-k and kNN across
        evaluators", point 4). ``alive(pos)`` says whether a dropped object
        is still in the window: one that left bounds nothing any more. O(n
        log n) for n entries, plus O(dropped).
        """
        if self.stale:
            return None
        if self.dropped:
            self.dropped = {pos: g for pos, g in self.dropped.items() if alive(pos)}
        missing = max(self.theta, max(self.dropped.values(), default=-math.inf)) if self.dropped else self.theta
        if not self.entries:
            return ([], missing) if missing == -math.inf else None
        held = list(self.entries.values())
        head, floor = rank(held, self.k)
        if missing != -math.inf and (len(held) < self.k or not below(floor) > missing):
            return None
        edge = below(floor)
        ranked = {h.pos for h in head}
        sent = head + [e for e in held if e.g >= edge and e.pos not in ranked]
        left = max((e.g for e in held if e.g < edge), default=-math.inf)
        return sent, max(missing, left)

    def restore(self, entries: list[Entry], bound: float) -> None:
        """Rebuild the buffer from its last report: the ``entries`` sent, in their order, and the ``bound``.

        A valid buffer that reads the same report: every local candidate the
        report left out is at most ``bound``, which becomes theta (the
        threshold :meth:`read` takes as the bound of what is not held).
        O(n^2) for n entries (the dominance counts).
        """
        self.stale = False
        self.entries = {e.pos: e for e in entries}
        self.theta, self.dropped, self.ceiling = bound, {}, math.inf
        self.dominators = {}
        if self.policy == "cskyband":
            self.dominators = {u.pos: sum(1 for p in entries if p is not u and self.dominates(p, u)) for u in entries}
        self.high = {pos for pos, count in self.dominators.items() if count >= self.k}
        self.best = None

    def refill(self, candidates: list[Entry], window_objects: int) -> None:
        """Re-evaluate from all of the evaluator's window candidates (Skype Algorithm 2).

        Parameters
        ----------
        candidates : list of Entry
            Every local window object that is a candidate, with its goodness.
        window_objects : int
            Objects in the local window store (|W| of the cost model).

        O(c log c) for c candidates.
        """
        self.stale = False
        self.entries, self.dominators, self.high, self.best = {}, {}, set(), None
        self.theta, self.dropped = -math.inf, {}
        if len(candidates) <= self.k:
            self.entries = {e.pos: e for e in candidates}
            return
        _, floor = rank(candidates, self.k)
        keep = _target_size(self.policy, self.k, len(candidates), window_objects)
        by_g = sorted(candidates, key=lambda e: -e.g)
        if keep < len(by_g):
            self.theta = min(by_g[keep - 1].g, below(floor, 2))
        chosen = [e for e in by_g if e.g >= self.theta]
        if self.policy != "cskyband":
            self.entries = {e.pos: e for e in chosen}
            return
        self.ceiling = floor
        for e in sorted(chosen, key=lambda e: (e.ts, e.pos)):
            self.offer(e)
        self.ceiling = math.inf


def _target_size(policy: str, k: int, candidates: int, window_objects: int) -> int:
    """Return how many of the best candidates a re-evaluation keeps under ``policy``.

    ``cskyband`` minimizes Skype Eq 13 over n0 (our reading, docs/ranked-papers.md 1.4):
    per window step, maintenance ``P * E|SB|`` with ``P = n0 / |W|`` and
    ``E|SB| = k (1 + ln(n0 / k))``, plus re-evaluation ``C_topk / E[T]`` with
    ``C_topk = SCAN_COST * candidates`` and ``E[T] = (n0 - k + 1)(n0 - k + 2) / P``
    (a lazy walk from n0 absorbed at k - 1, reflected at n0).
    """
    if policy == "topk":
        return k
    if policy == "kmax":
        return 3 * k
    w = max(window_objects, candidates, 1)
    best, best_cost = k, math.inf
    n0 = k
    while n0 <= candidates:
        p = n0 / w
        maintenance = p * k * (1 + math.log(n0 / k))
        reevaluation = SCAN_COST * candidates * p / ((n0 - k + 1) * (n0 - k + 2))
        cost = maintenance + reevaluation
        if cost < best_cost:
            best, best_cost = n0, cost
        n0 = max(n0 + 1, int(n0 * 1.25))
    return best
