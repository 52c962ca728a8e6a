"""learnedperf: predict the performance of distributed deep-learning training.

Importing the package loads nothing heavy; submodules (and torch / PyG) are
imported by the commands that need them.

The common names are importable from here and load their module on first use
(PEP 562)::

    from learnedperf import Predictor, RunSpec, load_checkpoint

The simulator's entry point is ``learnedperf.simulate.simulate`` (``from learnedperf.simulate
import simulate``): ``learnedperf.simulate`` is the simulator's subpackage, so the package
cannot also give a function of that name.
"""

__version__ = "0.1.0"

#: public name -> the submodule (relative to this package) that defines it; imported on first access
_LAZY = {
    "Predictor": "predict",
    "enumerate_strategies": "predict",
    "Checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "SimResult": "simulate",
    "RunSpec": "specs",
    "ModelSpec": "specs",
    "HardwareSpec": "specs",
    "Strategy": "specs",
    "LearnedPerfError": "errors",
    "SpecError": "errors",
    "InputError": "errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    """The public name ``name``, imported from its submodule on first access (then cached here).

    Raises:
        AttributeError: ``name`` is not a public name of the package (the message names it).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    """The module's attributes and the public names not imported yet."""
    return sorted(set(globals()) | set(_LAZY))
