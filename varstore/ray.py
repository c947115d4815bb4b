"""Ray Data on varstore: `VarstoreDatasink` writes a Ray Dataset as one varstore dataset, `read_varstore` reads one.

The public module; the code is `varstore.engines.ray`. Importing it needs the `ray` extra.
"""

from .engines.ray import VarstoreDatasink, read_varstore

__all__ = ["VarstoreDatasink", "read_varstore"]
