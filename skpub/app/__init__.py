"""The application shell: engines, CLI, metrics, progress and summary.

It sits on top of :mod:`skpub.router`, :mod:`skpub.evaluators`,
:mod:`skpub.sims` and the kernel, and owns the output and checkpoint
directories (:mod:`~skpub.app.output`, :mod:`~skpub.app.checkpoint`).
"""
