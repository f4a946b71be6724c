"""skpub: adaptive load-balancing routing for spatial-keyword publish/subscribe.

The kernel modules (``records``, ``geometry``, ``text``, ``config``) import
nothing from the ``router``, ``evaluators`` or ``sims`` packages; engines and
the CLI import everything. The contract every engine meets is
``docs/SEMANTICS.md``.
"""

__version__ = "0.1.0"
