"""Evaluators: per-evaluator state and matching semantics.

- :mod:`evaluators.gi2`: the GI^2 range-subscription index (PS2Stream IV-C).
- :mod:`evaluators.stats`: per-cell cost statistics (Tornado equations 1-2).
- :mod:`evaluators.evaluator`: the engine-free evaluator core.
- :mod:`evaluators.merge`: the merger of deliveries.
- :mod:`evaluators.spark_processor`: the Spark stateful processor hosting an evaluator.
"""
