"""The balancer: load summaries in, rebalancing operations and routing epochs out.

A layer of its own: it imports the router, the evaluators' summaries (through the kernel) and the kernel,
and only the application shell imports it (``docs/DESIGN.md`` "The balancer").

Operations, one module each:

- :mod:`skpub.balancer.shift`: Tornado's horizontal, vertical and corner shifts (SIGSPATIAL 2018 4.2, Figure 3;
  4.3).
- :mod:`skpub.balancer.splitmerge`: Tornado's split/merge (4.2, Figure 4, Eqs 4-5; the best split of 4.3).
- :mod:`skpub.balancer.textsplit`: PS2Stream's phase I (ICDE 2017 V-A): split a loaded rectangle by text, or take
  an evaluator out of a text-partitioned one.
- :mod:`skpub.balancer.migration`: PS2Stream's phase II, the Minimum Cost Migration of grid^t blocks (V-A): GR,
  with DP, SI, RA and the MILP optimum as baselines.
- :mod:`skpub.balancer.globaladjust`: PS2Stream's global load adjustment (V-B): the space repartitioned on the
  recent load, as one operation.
- :mod:`skpub.balancer.operation`: operations as cell moves, their costs C_r and C_t (Tornado Eqs 4-5), and
  applying them to a partitioning.
- :mod:`skpub.balancer.adjacency`: adjacent rectangles and the adjacency graph of partitions.

Deciding and carrying out:

- :mod:`skpub.balancer.policy`: the decision at a batch boundary: ``adaptive``, ``chaos`` or ``off``
  (Tornado 4.2-4.3; PS2Stream V-A, V-B).
- :mod:`skpub.balancer.transfer`: the balancer's step at a micro-batch boundary, the same on both engines: a
  transfer plan and the next epoch (Tornado 4.4 over micro-batches).
- :mod:`skpub.balancer.protocol`: Tornado's two-phase protocol as a pure state machine (4.4), for routing units
  that switch epochs at different moments.
"""
