"""learnedperf: predict the performance of distributed deep-learning training.

Importing the package loads nothing heavy; submodules (and torch / PyG) are
imported by the commands that need them.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
