"""Spark: `write_dataframe` turns a DataFrame into one varstore dataset, each partition's task writing its own shards.

The public module; the code is `varstore.engines.spark`. Importing it needs the `spark` extra.
"""

from .engines.spark import write_dataframe

__all__ = ["write_dataframe"]
