"""`GrainSource`: a varstore dataset or shard as a Grain ``RandomAccessDataSource`` (``pip install grain``; JAX is not
needed). Grain's protocol is duck-typed (``__len__``, ``__getitem__``, ``__repr__``), so nothing here imports Grain.
"""

from __future__ import annotations

import os
from typing import Any

from ..dataset.opening import open as open_dataset
from ..errors import RecordIndexError


class GrainSource:
    """Records of what `varstore.open` opens at `path`, by index, for ``grain.python.DataLoader`` and its samplers.

    Its ``repr`` names the path, the record count and the version opened (a dataset's is the BLAKE2b-128 of its
    manifest): Grain saves it in every checkpoint and refuses a checkpoint whose source's repr differs, so a
    dataset rewritten since the checkpoint is refused instead of read with indices that now name other records.
    Grain's worker processes get it pickled by path; each reopens the same version, or raises
    `DatasetReplacedError`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify_reads: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        self._reader = open_dataset(path, verify_reads=verify_reads, storage_options=storage_options,
                                    cache_dir=cache_dir, cache_limit=cache_limit)
        self._length = len(self._reader)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, record_key: int) -> Any:
        """The record at `record_key` (Grain's samplers give plain ints in ``[0, len)``)."""
        if not 0 <= record_key < self._length:
            raise RecordIndexError(
                f"record {record_key} is out of range for {self._reader.path} ({self._length} records)"
            )
        return self._reader[record_key]

    def __repr__(self) -> str:
        return f"GrainSource(path={self._reader.path!r}, records={self._length}, version={self._reader.version:x})"
