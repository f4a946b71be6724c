"""Evaluators: per-evaluator state and matching semantics, and the merge of ranked results across evaluators.

The evaluator and its range index:

- :mod:`skpub.evaluators.evaluator`: the engine-free evaluator core: routed rows in stream order, range matches,
  ranked work, statistics, and the balancer's hand-off and take-over.
- :mod:`skpub.evaluators.gi2`: GI^2, the grid-inverted index of boolean range subscriptions (PS2Stream IV-C).

Top-k and kNN (Skype VLDBJ 2017, DkM-SKS, CkQST; ``docs/ranked-papers.md``):

- :mod:`skpub.evaluators.window`: the window store: the objects an evaluator owns that are in the global window
  (SEMANTICS 4); the state-block key.
- :mod:`skpub.evaluators.ranked`: top-k and kNN subscriptions as an evaluator sees them: one handler per kind,
  values, entries and their order (SEMANTICS 3.2, 3.3).
- :mod:`skpub.evaluators.skyband`: one subscription's buffer: Skype's k-skyband (section 6) with cSkyband's
  threshold, and the kmax and top-k baselines.
- :mod:`skpub.evaluators.monitor`: the ranked monitor: each ranked subscription's buffer over this evaluator's
  window store, and its sparse reports at each mark.
- :mod:`skpub.evaluators.merge`: the merge keyed by subscription: the evaluators' reports into exact global
  results, ``enter``/``exit`` events and snapshot lines (SEMANTICS 5).

Load:

- :mod:`skpub.evaluators.stats`: per-cell cost statistics of one micro-batch (Tornado 4, Eqs 1-2, Figure 5).
- :mod:`skpub.evaluators.load`: decayed load statistics across micro-batches and the load summary the balancer
  reads (Tornado 4.3, Figure 5).

Durable state and hosting:

- :mod:`skpub.evaluators.durable`: versioned JSON documents of evaluator state (never pickle).
- :mod:`skpub.evaluators.state`: an evaluator's whole state as the Spark state store keeps it (and the local
  engine's checkpoints hold it), and its restore.
- :mod:`skpub.evaluators.batch`: one micro-batch of one evaluator on the Spark engine, and applying it (in a host
  or a worker).
- :mod:`skpub.evaluators.spark_processor`: the Spark stateful processor that hosts one evaluator per grouping key.
- :mod:`skpub.evaluators.host`: the evaluator host: one process per evaluator and executor JVM that keeps it hot.
- :mod:`skpub.evaluators.errors`: the evaluators' exceptions.
"""
