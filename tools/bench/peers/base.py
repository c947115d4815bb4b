"""What every adapter provides: write a workload to a directory, open it, read records by index, scan them."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..workloads import Workload


class Store:
    """An opened dataset. `get` returns the record in the library's own type (bytes-like, array or dict)."""

    def get(self, index: int) -> Any:
        raise NotImplementedError

    def get_batch(self, indices: np.ndarray) -> Any:
        """Records at `indices`; a library without a batch read loops over `get`."""
        get = self.get
        return [get(index) for index in indices.tolist()]

    def scan(self) -> Iterator[Any]:
        """Every record in order, the library's usual way to read a whole dataset."""
        get = self.get
        return (get(index) for index in range(len(self)))

    def verify(self) -> int | None:
        """Check every stored byte against its checksum; returns the bytes checked, or None without checksums."""
        return None

    def __len__(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release maps and handles, so the files can be evicted from the page cache."""


class DatasetStore(Store):
    """A store that is one library object: records by its indexing (or `get`), `scan` by its iteration."""

    def __init__(self, dataset: Any, get: Callable[[int], Any] | None = None) -> None:
        self.dataset = dataset
        self.get = get or dataset.__getitem__  # type: ignore[method-assign]

    def scan(self) -> Iterator[Any]:
        return iter(self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def close(self) -> None:
        del self.get
        self.dataset = None


class Peer:
    """A record store under test. `label` names it in tables; `native_batch` says `get_batch` is the library's own."""

    name = ""
    label = ""
    native_batch = False
    advice_variants: tuple[str, ...] = ()
    # False: DataLoader workers use the store the parent opened, inherited by fork (the library's own usage);
    # True: each process opens its own (LMDB environments and HDF5 files must not cross a fork).
    reopen_in_workers = False

    def unsupported(self, workload: Workload) -> str | None:
        """Why this peer cannot store `workload`, or None."""
        return None

    def write(self, workload: Workload, records: list[Any], directory: str) -> None:
        """Store `records` (generated from `workload` beforehand, so generation is not timed) under `directory`."""
        raise NotImplementedError

    def open(self, directory: str, workload: Workload, advice: str | None = None) -> Store:
        """Open what `write` made; `advice` ("random"/"normal") overrides madvise for peers that offer variants."""
        raise NotImplementedError

    def token_windows(self, directory: str, seq_len: int) -> tuple[Callable[[np.ndarray], Any], int] | None:
        """(read windows by index, number of windows) over the token workload's stream, or None if not offered."""
        return None
