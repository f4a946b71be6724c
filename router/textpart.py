"""Metric-based text partitioning: PS2Stream's text-only baseline (section VI-B).

Text partitioning splits the *terms* between the evaluators instead of the
space (PS2Stream cites [27], [28]; metric-based partitioning performed best
among its text baselines): a range subscription goes to the evaluator of
each of its clauses' keys, an object to the evaluator of each of its terms
that is a key there (:mod:`skpub.router.gridt`). The keys are cut into
``n`` groups of balanced Definition 1 weight (:func:`skpub.router.workload.group_terms`:
a key weighs its candidate pairs, objects and subscriptions in the sample).

In skpub every cell of the grid is then in a text-partitioned rectangle
shared by all evaluators with the same term assignment. The rectangles
themselves are the A-Grid's cost partitioning of the sample: each has one
*primary* evaluator, which keeps the window objects of its cells for
top-k/kNN (DESIGN "Text partitions"), so the window's load spreads by space
as on the A-Grid.
"""

from __future__ import annotations

import numpy as np

from skpub.router.gridt import TermTable
from skpub.router.partitioning import Partitioning, cost_partitioning
from skpub.router.sample import KeyedSample
from skpub.router.workload import LoadModel, group_terms, term_weights


def text_partitioning(sample: KeyedSample, costs: np.ndarray, n: int, model: LoadModel | None = None) -> Partitioning:
    """Partition the sample's keys between ``n`` evaluators over every cell (PS2Stream VI-B, metric-based).

    Parameters
    ----------
    sample : KeyedSample
    costs : ndarray, shape (size, size), float64
        Per-cell cost of the sample (for the primaries' rectangles).
    n : int
        Evaluators, >= 1.

    Returns
    -------
    Partitioning
        ``n`` text-partitioned rectangles, rectangle ``i``'s primary its
        owner in :func:`~skpub.router.partitioning.cost_partitioning`; one
        plain rectangle when ``n == 1``. O(sample terms + keys log keys).
    """
    if n == 1:
        return cost_partitioning(costs, n)
    model = model or LoadModel()
    o, q = sample.term_counts(np.arange(len(sample.keys)), np.arange(len(sample.sub_keys)))
    groups = group_terms(term_weights(model, o, q), n)
    return spread_by_space(costs, n, {t: g for g, terms in enumerate(groups) for t in terms})


def spread_by_space(costs: np.ndarray, n: int, assigned: dict[str, int]) -> Partitioning:
    """Return every cell text-partitioned by ``assigned`` over ``n`` evaluators, the primaries spread by space.

    The rectangles are :func:`~skpub.router.partitioning.cost_partitioning`'s
    over ``costs`` (shape (size, size), float64); rectangle ``i``'s term
    table has the same assignment (term -> evaluator, values in
    ``range(n)``) and its owner as primary, so the objects a window store
    needs spread over the evaluators by space instead of all going to one.
    O(size^2 + n^2).
    """
    space = cost_partitioning(costs, n)
    texts = tuple(TermTable(tuple((owner + j) % n for j in range(n)), assigned) for owner in space.owners.tolist())
    return Partitioning(space.size, space.boxes, space.owners, texts)
