"""Grain on varstore: `GrainSource` is a Grain ``RandomAccessDataSource`` over a varstore dataset or shard.

The public module; the code is `varstore.engines.grain`. It imports nothing of Grain (whose protocol is duck-typed).
"""

from .engines.grain import GrainSource

__all__ = ["GrainSource"]
