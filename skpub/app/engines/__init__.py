"""Engines: the local (embedded, in-process) engine and the Spark engine.

Both run the same cores: the parallel stage of routing (:mod:`skpub.router.locate`), the serial sequencer
(:mod:`skpub.router.sequencer`), the evaluators (:mod:`skpub.evaluators.evaluator`), the ranked merge
(:mod:`skpub.evaluators.merge`), the balancer's step (:mod:`skpub.balancer.transfer`) and the part-file encoding
(:mod:`skpub.kernel.parts`); the local engine calls them in one process, the Spark engine in separate tasks.

- :mod:`skpub.app.engines.local`: the local engine: the whole pipeline in one process (``LocalPipeline``,
  ``run_local``), also the data plane of the daemon and of ``skpub simulate``.
- :mod:`skpub.app.engines.sink`: the local engine's per-batch sink: a batch's part files, and the counters it
  fills in.
- :mod:`skpub.app.engines.local_checkpoint`: checkpoints of the local pipeline, so a daemon restart resumes from
  the newest one.
- :mod:`skpub.app.engines.local_plane`: the daemon's local data plane (``LocalPlane``, beside ``SparkPlane``): the
  pipeline over the daemon's logs, its commits and checkpoints.
- :mod:`skpub.app.engines.spark`: the Spark engine: the Structured Streaming query, its driver-side
  ``foreachBatch`` sink (counters, merge, balancer) and the daemon's ``SparkPlane``.
- :mod:`skpub.app.engines.source`: the Spark engine's streaming source (``skpub_lines``): the input files, or the
  daemon's ingest log, read in place.
- :mod:`skpub.app.engines.spark_tasks`: the Spark engine's routing tasks: the parallel ``ParseTask``, then the
  serial ``SequencerTask``.
- :mod:`skpub.app.engines.sequencer_host`: the sequencer's host: one process per executor JVM that keeps the
  Spark engine's sequencer hot.
- :mod:`skpub.app.engines.spark_daemon`: the daemon of Spark's Python workers: PySpark's own, importing PySpark
  from its installed package rather than ``pyspark.zip``.

The evaluators' Spark side lives with them (:mod:`skpub.evaluators.spark_processor`,
:mod:`skpub.evaluators.batch`, :mod:`skpub.evaluators.host`).
"""
