"""Errors raised by learnedperf.

Every error that reaches a user names the offending field or file, so that the
command line and the HTTP service can print one clear line instead of a traceback.
"""

from __future__ import annotations


class LearnedPerfError(Exception):
    """Base class of every error learnedperf raises on purpose."""


class SpecError(LearnedPerfError, ValueError):
    """An input run, model, device or strategy is invalid.

    Attributes:
        field: dotted path of the offending field, e.g. ``"strategy.tp"``.
        message: what is wrong with it.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class CatalogError(SpecError):
    """A catalog name (device, cluster, model) is unknown."""


class InputError(LearnedPerfError, ValueError):
    """A file or stream could not be read (bad JSON, unreadable file, ...)."""
