"""Engines: the local (embedded, in-process) engine and the Spark engine.

Both run the same cores: the parallel stage of routing
(:mod:`skpub.router.locate`), the serial sequencer (:mod:`skpub.router.sequencer`),
the evaluators (:mod:`skpub.evaluators.evaluator`) and the part-file encoding
(:mod:`skpub.kernel.parts`); the local engine calls them in one process, the
Spark engine in separate tasks (:mod:`skpub.app.engines.spark_tasks`).
"""
