"""Routing: where each record goes (Tornado section 3, PS2Stream section IV).

- :mod:`router.grid`: the fine grid over the space.
- :mod:`router.partitioning`: partitions as rectangles of fine cells, the
  initial cost-based partitioning (Tornado section 4.1) and the uniform one.
- :mod:`router.agrid`: the A-Grid with neighbor-based range routing.
- :mod:`router.uniform`: Uni-Space-Rout, the uniform-grid baseline.
- :mod:`router.summary`: textual summaries per evaluator.
- :mod:`router.epoch`: immutable, versioned routing tables.
- :mod:`router.dispatch`: the stateful routing unit that applies all of these.
"""
