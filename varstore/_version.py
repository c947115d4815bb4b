"""The package version, in one place (the command line's --version reads it without importing the package)."""

__version__ = "0.1.0"
