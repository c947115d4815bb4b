"""Which rank of how many this process is, from explicit arguments or the initialised process group."""

from __future__ import annotations

import os

import torch.distributed

from ..errors import VarstoreError
from .resume import as_int


def rank_and_world_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """`(rank, world_size)` as given, else from ``torch.distributed``, else ``(0, 1)`` for a single process.

    A launcher that set ``WORLD_SIZE`` above 1 without a process group is an error:
    falling back to one process would make every rank read the whole dataset.
    """
    if rank is None and world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        launched = os.environ.get("WORLD_SIZE", "1")
        if launched.isdigit() and int(launched) > 1:
            raise VarstoreError(
                f"WORLD_SIZE is {launched} but no process group is initialised: create this after "
                "torch.distributed.init_process_group, or pass rank and world_size"
            )
        return 0, 1
    if rank is None or world_size is None:
        raise VarstoreError(f"pass both rank and world_size or neither (got rank={rank}, world_size={world_size})")
    rank, world_size = as_int(rank, "rank"), as_int(world_size, "world_size")
    if world_size < 1 or not 0 <= rank < world_size:
        raise VarstoreError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size
