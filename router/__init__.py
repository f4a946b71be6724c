"""Routing: where each record goes (Tornado SIGSPATIAL 2018 sections 3-4.1, PS2Stream ICDE 2017 section IV).

The routing unit's two stages and their state:

- :mod:`skpub.router.locate`: the parallel stage: parse, validate, normalize and locate each line.
- :mod:`skpub.router.sequencer`: the serial stage: id registry, placements, textual summaries, the stream clock.
- :mod:`skpub.router.dispatch`: both stages in one process (the local engine's routing unit).
- :mod:`skpub.router.state`: the sequencer's durable state: id-registry bases and per-batch journals.
- :mod:`skpub.router.summary`: textual summaries per evaluator (Tornado 3.1).

Routing tables:

- :mod:`skpub.router.table`: the routing-table interface: a point to its cell's owner, a rectangle to every
  partition it overlaps.
- :mod:`skpub.router.partitioning`: partitionings: disjoint rectangles of fine cells, each owned by an evaluator
  (text-partitioned ones included), and the cost-based (Tornado 4.1) and uniform constructions.
- :mod:`skpub.router.agrid`: the A-Grid with neighbor-based range routing over rectangles (Tornado 3.1).
- :mod:`skpub.router.uniform`: Uni-Space-Rout, the uniform-grid baseline (Tornado 5.1).
- :mod:`skpub.router.gridt`: grid^t's term tables, where a text-partitioned rectangle sends each term
  (PS2Stream IV-C).
- :mod:`skpub.router.epoch`: routing epochs: immutable, versioned routing tables in force from a micro-batch on.

The initial partitioning, from a sample of the stream's head:

- :mod:`skpub.router.initial`: the epoch-0 routing table of a deployment (``--router``) and the sample's cost
  estimate (Tornado 4.1, Eq. 1).
- :mod:`skpub.router.sample`: the sample, parsed once and located on the fine grid.
- :mod:`skpub.router.workload`: an evaluator's load over the sample (PS2Stream Definition 1), for the text-aware
  partitionings.
- :mod:`skpub.router.kdt`: PS2Stream's hybrid kd^t-tree (IV-B, Algorithm 1).
- :mod:`skpub.router.kdtree`: kd-tree partitioning, PS2Stream's space-only baseline (VI-B).
- :mod:`skpub.router.textpart`: metric-based text partitioning, PS2Stream's text-only baseline (VI-B).

- :mod:`skpub.router.errors`: the routing layer's exceptions.

The fine grid the tables index by is kernel (:mod:`skpub.kernel.grid`), shared with the evaluators.
"""
