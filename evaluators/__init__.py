"""Evaluators: per-evaluator state and matching semantics.

- :mod:`skpub.evaluators.gi2`: the GI^2 range-subscription index (PS2Stream IV-C).
- :mod:`skpub.evaluators.stats`: per-cell cost statistics (Tornado equations 1-2).
- :mod:`skpub.evaluators.evaluator`: the engine-free evaluator core.
- :mod:`skpub.evaluators.spark_processor`: the Spark stateful processor hosting an evaluator.
"""
