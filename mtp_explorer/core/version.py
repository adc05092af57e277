"""The package's version (one place: the package, the cost profiles and the CLI read it here)."""

__version__ = "0.1.0"
