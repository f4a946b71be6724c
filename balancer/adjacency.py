"""Who touches whom: adjacent rectangles and the adjacency graph of partitions.

Two rectangles are adjacent when they share a stretch of edge; two
partitions (evaluators) are adjacent when any of their rectangles are. The
shifts of Tornado 4.2 work on adjacent rectangles, split/merge on adjacent
partitions (a networkx graph, so "which pairs can merge" is a graph query).
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from skpub.router.partitioning import Partitioning

_LAST: tuple[Partitioning | None, list[tuple[int, int]]] = (None, [])
"""The partitioning :func:`adjacent_rectangles` last answered for, and its answer (read and replaced whole)."""


def adjacent_rectangles(partitioning: Partitioning) -> list[tuple[int, int]]:
    """Return the pairs ``(i, j)``, ``i < j``, of rectangles of different owners that share an edge.

    One vectorized pass over the grid's rectangle map: O(grid cells) in
    numpy, about 10 ms on 1000 x 1000; asked again about the same
    partitioning object (a frozen one: the epoch in force, weighed at every
    batch until the balancer changes it), O(pairs).
    """
    global _LAST
    last = _LAST
    if last[0] is partitioning:
        return list(last[1])
    pairs = _adjacent(partitioning)
    _LAST = (partitioning, pairs)
    return list(pairs)


def _adjacent(partitioning: Partitioning) -> list[tuple[int, int]]:
    rect_of, owner = partitioning.rect_of, partitioning.owner
    pairs = []
    for a, b, oa, ob in (
        (rect_of[:, :-1], rect_of[:, 1:], owner[:, :-1], owner[:, 1:]),
        (rect_of[:-1, :], rect_of[1:, :], owner[:-1, :], owner[1:, :]),
    ):
        edge = oa != ob
        if edge.any():
            pairs.append(np.stack([np.minimum(a[edge], b[edge]), np.maximum(a[edge], b[edge])], axis=1))
    if not pairs:
        return []
    both = np.concatenate(pairs).astype(np.int64)
    n = len(partitioning.boxes)
    codes = np.unique(both[:, 0] * n + both[:, 1])  # one key per pair: a 1-D sort, not a row-wise one
    return list(zip(*(v.tolist() for v in np.divmod(codes, n)), strict=True))


def partition_graph(partitioning: Partitioning, rect_pairs: list[tuple[int, int]] | None = None) -> nx.Graph:
    """Return the graph whose nodes are evaluators and whose edges join adjacent partitions."""
    graph = nx.Graph()
    graph.add_nodes_from(range(partitioning.count))
    owners = partitioning.owners.tolist()
    pairs = adjacent_rectangles(partitioning) if rect_pairs is None else rect_pairs
    graph.add_edges_from((owners[i], owners[j]) for i, j in pairs)
    return graph
