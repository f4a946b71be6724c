"""Exceptions of the routing layer."""

from skpub.kernel.errors import SkpubError


class RoutingError(SkpubError):
    """A routing table is inconsistent (partitions overlap or leave cells uncovered)."""


class EpochError(RoutingError):
    """No routing epoch is in force for a micro-batch, or an epoch file is damaged."""
