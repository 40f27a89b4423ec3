"""lbtestbed: load-balancing policies from the literature, simulated, predicted and emulated."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lbtestbed")  # pyproject.toml's, as installed
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"
