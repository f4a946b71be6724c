"""Routing: where each record goes (Tornado section 3, PS2Stream section IV).

- :mod:`skpub.kernel.grid`: the fine grid over the space.
- :mod:`skpub.router.partitioning`: partitions as rectangles of fine cells, the
  initial cost-based partitioning (Tornado section 4.1) and the uniform one.
- :mod:`skpub.router.agrid`: the A-Grid with neighbor-based range routing.
- :mod:`skpub.router.uniform`: Uni-Space-Rout, the uniform-grid baseline.
- :mod:`skpub.router.kdtree`: kd-tree partitioning, PS2Stream's space baseline.
- :mod:`skpub.router.summary`: textual summaries per evaluator.
- :mod:`skpub.router.epoch`: immutable, versioned routing tables.
- :mod:`skpub.router.locate`: the parallel stage: parse, validate, locate each line.
- :mod:`skpub.router.sequencer`: the serial stage: id registry, placements, summaries.
- :mod:`skpub.router.state`: the sequencer's durable state (versioned JSON).
- :mod:`skpub.router.dispatch`: both stages in one process (the local engine).
"""
