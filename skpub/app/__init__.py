"""The application shell: engines, CLI, daemon, simulations, metrics, progress and summary.

It sits on top of :mod:`skpub.balancer`, :mod:`skpub.router`, :mod:`skpub.evaluators`, :mod:`skpub.sims` and
the kernel, and owns the output and checkpoint directories.

- :mod:`skpub.app.engines`: the local and Spark engines (its own docstring lists their modules).
- :mod:`skpub.app.cli`: the ``skpub`` command line: ``run``, ``workload geonames``, ``simulate``, ``serve``.
- :mod:`skpub.app.progress`: a live progress bar on a terminal (rich), sparse plain lines elsewhere.
- :mod:`skpub.app.summary`: progress and the end-of-run summary (``BatchReport``, ``RunObserver``, simulated
  parallel seconds).
- :mod:`skpub.app.metrics`: Prometheus metrics of a run (``--metrics-port``; the daemon's ``/metrics``).
- :mod:`skpub.app.console`: a quiet console: the engine's own log lines to a file, skpub's progress on the
  terminal.
- :mod:`skpub.app.output`: the output directory layout (SEMANTICS 5) and who may touch it.
- :mod:`skpub.app.checkpoint`: the layout of a Spark run's checkpoint directory and who may touch it.
- :mod:`skpub.app.serve`: ``skpub serve``: the daemon in one process (the HTTP API on uvicorn, the data plane in a
  thread).
- :mod:`skpub.app.api`: the daemon's HTTP API (``/v1``, FastAPI; its OpenAPI document generated from the code).
- :mod:`skpub.app.schemas`: the API's request and response bodies as typed models (they generate the document).
- :mod:`skpub.app.admission`: the check of a subscription request before the API acknowledges it (SEMANTICS 7).
- :mod:`skpub.app.targets`: delivery targets: the daemon pushes deliveries out (SEMANTICS 7).
- :mod:`skpub.app.senders`: how a target sends, one class per kind: webhook, MQTT, NATS, Redis Streams.
- :mod:`skpub.app.remote`: the CLI verbs that talk to a running daemon (over :mod:`skpub.client`).
- :mod:`skpub.app.daemon`: the daemon's core: durable ingest, the data plane running on, the logs it serves.
- :mod:`skpub.app.journal`: append-only, fsync'd logs of lines in segments: the daemon's ingest log, batch
  journal, commit log and output logs.
- :mod:`skpub.app.commits`: the daemon's commit log (one commit per micro-batch) and its compaction into bases.
- :mod:`skpub.app.simulate`: ``skpub simulate``: workload-skew simulations for capacity planning.
- :mod:`skpub.app.report`: the report of ``skpub simulate``: one self-contained HTML page, its plots and CSVs.
"""
