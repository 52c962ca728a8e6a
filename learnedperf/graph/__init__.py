"""Operator graphs of models and execution graphs of runs (see :mod:`.ops`, :mod:`.execution`)."""
