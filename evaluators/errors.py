"""Exceptions of the evaluators."""

from skpub.kernel.errors import SkpubError


class EvaluatorError(SkpubError):
    """An evaluator received a record it cannot hold, or its state is damaged."""
