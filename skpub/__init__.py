"""skpub: adaptive load-balancing routing for spatial-keyword publish/subscribe.

Every import name lives under ``skpub``, in layers (``pyproject.toml``
states them as import-linter contracts, checked by the test suite):

- :mod:`skpub.app` (the application shell): engines, CLI, metrics, progress
  and summary, output and checkpoint directories. Imports everything below.
- :mod:`skpub.balancer`: load summaries in, rebalancing operations and
  routing epochs out (Tornado 4.2-4.4, PS2Stream V-A). Imports the layers
  below.
- :mod:`skpub.router`, :mod:`skpub.evaluators`, :mod:`skpub.sims`: routing,
  evaluation, workload generation. Each imports only the kernel, never one
  another. (In the repository they are the top-level folders ``router/``,
  ``evaluators/`` and ``sims/``, mapped into the package, as is
  ``balancer/``.)
- :mod:`skpub.kernel`: records, geometry, fine grid, text, config, id
  registry, the messages that cross layers, the oracle, errors. Imports
  nothing above it.

The contract every engine meets is ``docs/SEMANTICS.md``.
"""

__version__ = "0.1.0"
