"""Exceptions raised by the skpub kernel and application shell.

Every exception the project raises derives from :class:`SkpubError`, so a
caller can catch the whole family at once. Invalid *input records* never raise:
they become dead letters (``skpub.kernel.records.DeadLetter``).
"""


class SkpubError(Exception):
    """Root of every skpub exception."""


class ConfigError(SkpubError):
    """A deployment configuration is invalid (bad value, unknown key)."""


class ExpressionError(SkpubError):
    """A boolean keyword expression does not parse (dead-letter ``bad_expr``)."""


class InputError(SkpubError):
    """An input path is missing, empty or unreadable."""


class JavaNotFoundError(SkpubError):
    """The Spark engine needs a Java runtime (17 or newer) and none was found."""


class EngineError(SkpubError):
    """An engine failed while processing (the Spark query stopped with an error)."""


class CheckpointError(SkpubError):
    """A checkpoint directory belongs to another deployment or is damaged."""


class OutputError(SkpubError):
    """An output directory holds files skpub did not write, holds a finished run, or cannot be written."""


class MetricsError(SkpubError):
    """The metrics endpoint cannot be served (port out of range or in use)."""
