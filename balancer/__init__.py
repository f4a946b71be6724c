"""The balancer: load summaries in, rebalancing operations and routing epochs out.

Tornado's shift and split/merge (:mod:`~skpub.balancer.shift`,
:mod:`~skpub.balancer.splitmerge`; SIGSPATIAL 2018 sections 4.2-4.3),
PS2Stream's minimum-cost migration (:mod:`~skpub.balancer.migration`;
ICDE 2017 section V-A), the cost model and the moves
(:mod:`~skpub.balancer.operation`), the policies
(:mod:`~skpub.balancer.policy`) and the two-phase protocol
(:mod:`~skpub.balancer.protocol`, Tornado 4.4). A layer of its own: it imports
the router, the evaluators' summaries (through the kernel) and the kernel,
and only the application shell imports it (``docs/DESIGN.md`` "The balancer").
"""
