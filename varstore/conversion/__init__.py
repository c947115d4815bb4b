"""Datasets from other formats: `driver` (`convert`: ``varstore convert`` in one process or several), the input formats
it reads (`sources`), how a field is found in a sample (`fields`) and the progress it reports (`varstore.progress`).
"""

from .driver import convert

__all__ = ["convert"]
