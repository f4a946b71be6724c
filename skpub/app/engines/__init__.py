"""Engines: the local (embedded, in-process) engine and the Spark engine.

Both run the same router and evaluator cores and write through
:mod:`skpub.app.engines.sink`, so they produce the same output by construction.
"""
