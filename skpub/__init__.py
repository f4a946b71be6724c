"""skpub: adaptive load-balancing routing for spatial-keyword publish/subscribe.

Every import name lives under ``skpub``, in layers (``pyproject.toml``
states them as import-linter contracts, checked by the test suite;
``docs/DESIGN.md`` "Layout and layers"). The subpackages, top layer first:

- :mod:`skpub.app`: the application shell: the engines (local, Spark), the
  CLI, the daemon (``skpub serve``), ``skpub simulate`` and its report,
  metrics, progress and summary, output and checkpoint directories. Imports
  everything below.
- :mod:`skpub.balancer`: load summaries in, rebalancing operations and
  routing epochs out (Tornado SIGSPATIAL 2018 4.2-4.4; PS2Stream ICDE 2017
  V-A, V-B). Imports the layers below.
- :mod:`skpub.router`: where each record goes: the parallel parse-and-locate
  stage, the serial sequencer, routing tables, epochs and the initial
  partitionings (Tornado 3-4.1, PS2Stream IV).
- :mod:`skpub.evaluators`: what matches: per-evaluator state (GI^2, window
  store, top-k/kNN buffers, cost statistics) and the merge of ranked results
  (PS2Stream IV-C; Skype VLDBJ 2017, DkM-SKS, CkQST).
- :mod:`skpub.sims`: workload generators (GeoNames and its skew variants).

  The router, the evaluators and the workloads each import only the kernel,
  never one another. (In the repository they are the top-level folders
  ``router/``, ``evaluators/`` and ``sims/``, mapped into the package, as is
  ``balancer/``.)
- :mod:`skpub.kernel`: what every layer shares: records and validation,
  geometry, fine grid, text, config, id registry, the messages that cross
  layers, part files, the oracle, errors. Imports nothing above it.

The contract every engine meets is ``docs/SEMANTICS.md``.
"""

__version__ = "0.1.0"
