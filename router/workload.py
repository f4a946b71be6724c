"""The load of one evaluator (PS2Stream Definition 1) over a located workload sample, for the text-aware partitionings.

Definition 1: an evaluator's load over a period is
``L = c1 |O| |Q| + c2 |O| + c3 |Q^i| + c4 |Q^d|``: checks of objects against
subscriptions, objects handled, subscription insertions and deletions. With
GI^2 an object is checked only against the subscriptions filed under its own
terms, so skpub counts the checks as *candidate pairs*, ``sum over terms t of
|O_t| |Q_t|`` (objects holding t times subscriptions whose key is t), the
``q_l`` of Tornado Eq. 1 that the evaluators' statistics count too. A
sample holds no deletions, so ``c4`` weighs nothing here (it is kept for the
balancer's statistics). Only *keys* (each subscription clause's least
frequent keyword, what GI^2 files it under and what an object is routed by
in a text-partitioned rectangle) matter: an object with none costs nothing
anywhere, since no textual summary admits it.

:class:`LoadModel` holds the coefficients, measured on this code by
``python -m benchmarks.workload`` (docs/benchmarks.md (i)) in units of one
object handled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LoadModel:
    """PS2Stream Definition 1's coefficients, in units of ``c2`` (one object handled).

    ``c1``: one candidate (object, subscription) check; ``c3``: one range
    subscription inserted; ``c4``: one deleted. Defaults measured by
    ``python -m benchmarks.workload`` (c2 = 1.08 us of evaluator CPU here).
    """

    c1: float = 0.04
    c2: float = 1.0
    c3: float = 2.5
    c4: float = 1.3


def space_load(model: LoadModel, o: Counter, q: Counter, objects: int, subscriptions: int) -> float:
    """Return Definition 1 for one evaluator holding a region whole: candidate pairs, objects, insertions."""
    pairs = sum(n * q[t] for t, n in o.items() if t in q)
    return model.c1 * pairs + model.c2 * objects + model.c3 * subscriptions


def term_weights(model: LoadModel, o: Counter, q: Counter) -> dict[str, float]:
    """Return Definition 1 per key for a region partitioned by text: its pairs, objects and subscriptions.

    An object is sent once per evaluator its keys reach, so counting it once
    per key is an upper bound.
    """
    return {t: model.c1 * o.get(t, 0) * n + model.c2 * o.get(t, 0) + model.c3 * n for t, n in q.items()}


def group_terms(weights: dict[str, float], k: int) -> list[list[str]]:
    """Cut the keys into at most ``k`` groups of balanced weight (LPT: heaviest first to the lightest group).

    Returns
    -------
    list of list of str
        Non-empty groups, ``min(k, len(weights))`` of them, each sorted; deterministic (ties by term).
        O(terms log terms + terms x k).
    """
    k = min(k, len(weights))
    groups: list[list[str]] = [[] for _ in range(k)]
    loads = [0.0] * k
    for t in sorted(weights, key=lambda t: (-weights[t], t)):
        g = min(range(k), key=lambda j: (loads[j], j))
        groups[g].append(t)
        loads[g] += weights[t]
    return [sorted(g) for g in groups if g]


def cosine(a: Counter, b: Counter) -> float:
    """Return the cosine similarity of two term-count vectors (0 when either is empty); PS2Stream's sim_t."""
    dot = sum(n * b[t] for t, n in a.items() if t in b)
    if not dot:
        return 0.0
    return dot / (np.sqrt(sum(n * n for n in a.values())) * np.sqrt(sum(n * n for n in b.values())))


def weights_of(groups: Sequence[Iterable[str]], weights: dict[str, float]) -> list[float]:
    """Return each group's weight."""
    return [sum(weights[t] for t in g) for g in groups]
