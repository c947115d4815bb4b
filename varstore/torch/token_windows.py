"""`TokenWindowDataset`: fixed-length language-model samples cut from the concatenated tokens of a dataset.

The records of a 1-D integer ``ndarray`` dataset (one document each) are read as one
token stream: shard after shard in manifest order, record after record. Sample i is
tokens ``[i * seq_len, i * seq_len + seq_len + 1)``: inputs and next-token targets,
cut across document and shard boundaries, so no token is lost at either. The last
``(token_count - 1) % seq_len`` tokens fall in no sample.

Nothing is built per token or per document: a window's place is arithmetic, the
only table is one int64 per shard, and document starts are found by binary search
in the shard's offsets, which stay in the memory-mapped index. Windows are read
from the raw token arrays (`Reader.as_array`), so record checksums are not checked
on the way: run `verify()` on the dataset once before training on it. Compressed
shards hold no raw tokens: a compressed shard is refused when the dataset is made
of it, a compressed shard of a dataset when it is first read.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..dataset.reader import ShardedReader
from ..errors import CorruptRecordError, RecordIndexError, RecordTypeError, VarstoreError
from ..format.compression import NAMES as COMPRESSION_NAMES
from ..shard.reader import Reader
from ..shard.remote_shard import RemoteShard
from .collate import stored_tensor, tensor_dtype
from .datasets import OUTPUTS, Output, check_choice, check_keep_dtype
from .reading import AnyReader, ProcessLocalReader


def _check_uncompressed(shard: Reader | RemoteShard) -> None:
    """Refuse a compressed shard (§1.6, §1.7): a window's place is computed from the stored tokens (the data size,
    the offsets), which such a shard does not hold."""
    if shard.header.compression:
        raise RecordTypeError(
            f"token windows need uncompressed shards, whose tokens are stored as they are; this one is "
            f"{COMPRESSION_NAMES[shard.header.compression]}: write the dataset with compression=None", path=shard.path)


def _shard_token_counts(reader: AnyReader, itemsize: int) -> list[int]:
    if not isinstance(reader, ShardedReader):
        return [reader.header.data_size // itemsize]
    return [entry.data_size // itemsize for entry in reader.manifest.shards]


def _remote_pieces(shard: RemoteShard, local: np.ndarray, length: np.ndarray) -> list[np.ndarray]:
    """Tokens [local, local + length) of a remote `shard`, per piece: the documents they overlap, read with
    one `get_batch_flat` (merged, concurrent ranged reads, each document checked against its CRC32C)."""
    token_offsets = (shard.offsets // shard.dtype.itemsize).astype(np.int64)
    first = np.searchsorted(token_offsets, local, side="right") - 1
    last = np.searchsorted(token_offsets, local + length, side="left")  # one past the last document overlapped
    documents = np.unique(_concatenated_ranges(first, last - first))
    values = shard.get_batch_flat(documents).values
    # The documents of a piece are consecutive, so their tokens sit back to back in `values`.
    selected_starts = np.zeros(len(documents), np.int64)
    np.cumsum(np.diff(token_offsets)[documents][:-1], out=selected_starts[1:])
    begins = selected_starts[np.searchsorted(documents, first)] + local - token_offsets[first]
    return [values[begin : begin + count] for begin, count in zip(begins.tolist(), length.tolist())]


def _concatenated_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(start, start + length) for ...])``, without a Python loop."""
    firsts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    return np.repeat(starts - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


class TokenWindowDataset(Dataset):
    """Windows of ``seq_len + 1`` tokens in stream order; shuffle them with a sampler.

    `ExactlyOnceSampler(dataset, seed=...)` with `set_epoch` gives a deterministic
    permutation per (seed, epoch) computed in O(1) memory. The shuffle lives in the
    sampler, in the main process, so it reaches persistent workers and resuming
    needs only a count; ``DataLoader(shuffle=True)`` works too.

    A sample is an int64 tensor of ``seq_len + 1`` tokens (``keep_dtype=True``: a
    tensor of the stored dtype, for memory; uint64 tokens of 2**63 or more need it), or with
    ``document_starts=True`` a dict ``{"tokens": ..., "document_starts": ...}`` whose
    bool tensor marks the positions where a document begins, for resetting position
    ids or masking attention between documents. Each window is copied once, from the
    map into a new array. ``output="numpy"`` keeps the stored dtype and returns windows
    inside one shard as zero-copy read-only views, for numpy code: torch's
    `default_collate` would warn about them in a DataLoader, where the default output
    makes the one copy instead.

    The stored documents stay in the same order every epoch (as they were written);
    shuffle documents at write time if samples should not always pair the same neighbours.

    `path` may be a URL of object storage (see `varstore.open`), with `storage_options`, `cache_dir`
    and `cache_limit` for its reader. A remote window is read as the documents it overlaps (whole: one
    merged, concurrent ranged read per shard a batch touches, each document checked against its CRC32C),
    so documents much longer than `seq_len` cost more bytes than the window.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        seq_len: int,
        *,
        document_starts: bool = False,
        output: Output = "torch",
        keep_dtype: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
    ) -> None:
        check_choice("output", output, OUTPUTS)
        check_keep_dtype(keep_dtype, output)
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)):
            raise RecordTypeError(f"seq_len must be an integer, not {type(seq_len).__name__}")
        if seq_len < 1:
            raise VarstoreError(f"seq_len must be at least 1, not {seq_len}")
        self._source = ProcessLocalReader(
            path, whole_shards=True, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
        )
        self.path = self._source.path
        reader = self._source.get()
        if reader.codec != "ndarray" or reader.dtype is None or reader.dtype.kind not in "iu" or reader.shape:
            raise RecordTypeError(
                f"token windows need 1-D integer ndarray records; this dataset is {reader.codec}"
                + (f" of dtype {reader.dtype} and trailing shape {reader.shape}" if reader.dtype is not None else ""),
                path=self.path,
            )
        self._tensor_dtype = tensor_dtype(reader.dtype, keep_dtype) if output == "torch" else reader.dtype
        self.seq_len = seq_len
        self.document_starts = document_starts
        self.output = output
        self.dtype: np.dtype = reader.dtype
        if not isinstance(reader, ShardedReader):  # a dataset's shards are checked as they are first read
            _check_uncompressed(reader)
        counts = np.array(_shard_token_counts(reader, self.dtype.itemsize), np.int64)
        self._token_starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self._token_starts[1:])
        self.token_count = int(self._token_starts[-1])
        self._length = max(0, (self.token_count - 1) // seq_len)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (
            f"TokenWindowDataset({self.path!r}, seq_len={self.seq_len}, windows={self._length}, "
            f"token_count={self.token_count})"
        )

    def _shard(self, position: int) -> Reader | RemoteShard:
        reader = self._source.get()
        return reader.shard(position) if isinstance(reader, ShardedReader) else reader

    def _piece_tokens(self, position: int, local: np.ndarray, length: np.ndarray) -> list[np.ndarray]:
        """Tokens [local, local + length) of shard `position`, per piece: views of the map for a local
        shard, copies of ranged reads for a remote one."""
        shard = self._shard(position)
        _check_uncompressed(shard)
        if isinstance(shard, RemoteShard):
            return _remote_pieces(shard, local, length)
        tokens = shard.as_array()
        return [tokens[start : start + count] for start, count in zip(local.tolist(), length.tolist())]

    def _pieces(self, starts: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Split windows at shard ends: (shard, window rows, start in shard, column in window, length) per shard.

        Each pass takes every unfinished window up to the end of its window or of its
        shard, so a window spanning s shards is done in s passes.
        """
        width = self.seq_len + 1
        rows = np.arange(len(starts))
        position = starts.copy()
        column = np.zeros(len(starts), np.int64)
        while rows.size:
            shard = np.searchsorted(self._token_starts, position, side="right") - 1
            shard_end = self._token_starts[shard + 1]
            window_end = starts[rows] + width
            length = np.minimum(window_end, shard_end) - position
            for current in np.unique(shard).tolist():
                chosen = shard == current
                yield current, rows[chosen], position[chosen] - self._token_starts[current], column[chosen], length[chosen]
            more = window_end > shard_end
            rows, position, column = rows[more], shard_end[more], column[more] + length[more]

    def _window_starts(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        resolved = np.asarray(indices)
        if resolved.ndim != 1 or (resolved.size and resolved.dtype.kind not in "iu"):
            raise RecordTypeError(
                f"window indices must be a 1-D sequence of integers, got {resolved.dtype} of shape {resolved.shape}"
            )
        resolved = resolved.astype(np.int64)
        outside = (resolved < 0) | (resolved >= self._length)
        if outside.any():
            bad = int(resolved[outside.argmax()])
            raise RecordIndexError(
                f"window {bad} is out of range for {self._length} windows of {self.seq_len} tokens", path=self.path
            )
        return resolved * self.seq_len

    def _gather(self, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The windows starting at `starts`, copied into one ``(len(starts), seq_len + 1)`` array of `dtype`."""
        windows = np.empty((len(starts), self.seq_len + 1), dtype)
        for shard, rows, local, column, length in self._pieces(starts):
            # One slice copy per piece: cheaper than per-token index arrays, as a window has one or two pieces.
            pieces = self._piece_tokens(shard, local, length)
            for row, target, count, piece in zip(rows.tolist(), column.tolist(), length.tolist(), pieces):
                windows[row, target : target + count] = piece
        return windows

    def _document_starts(self, starts: np.ndarray) -> np.ndarray:
        """A bool ``(len(starts), seq_len + 1)`` array, True where a document begins."""
        itemsize = self.dtype.itemsize
        marks = np.zeros((len(starts), self.seq_len + 1), bool)
        for shard, rows, local, column, length in self._pieces(starts):
            document_offsets = self._shard(shard).offsets[:-1]
            low = np.searchsorted(document_offsets, (local * itemsize).astype(np.uint64), side="left")
            high = np.searchsorted(document_offsets, ((local + length) * itemsize).astype(np.uint64), side="left")
            counts = (high - low).astype(np.int64)
            byte_positions = document_offsets[_concatenated_ranges(low, counts)].astype(np.int64)
            if (byte_positions % itemsize).any():
                shard_reader = self._shard(shard)
                bad = int(byte_positions[(byte_positions % itemsize).argmax()])
                raise CorruptRecordError(
                    f"a document starts at byte {bad}, inside a {itemsize}-byte token: the offsets are damaged",
                    path=shard_reader.index_path,
                )
            token_positions = byte_positions // itemsize
            marks[np.repeat(rows, counts), token_positions - np.repeat(local - column, counts)] = True
        return marks

    def _tokens(self, starts: np.ndarray) -> list[Any]:
        if self.output == "torch" and (self.dtype != np.uint64 or self._tensor_dtype == self.dtype):
            return list(torch.from_numpy(self._gather(starts, self._tensor_dtype)))
        if self.output == "torch":  # uint64 to int64: the values are checked to fit before converting
            width = self.seq_len + 1
            where = lambda element: f"window {int(starts[element // width]) // self.seq_len}"  # noqa: E731
            return list(stored_tensor(self._gather(starts, self.dtype), False, where, self.path))
        width = self.seq_len + 1
        shard = np.searchsorted(self._token_starts, starts, side="right") - 1
        inside = starts + width <= self._token_starts[shard + 1]
        windows: list[Any] = [None] * len(starts)
        for position in np.unique(shard[inside]).tolist():
            rows = np.flatnonzero(inside & (shard == position))
            local = starts[rows] - self._token_starts[position]
            for row, window in zip(rows.tolist(), self._piece_tokens(position, local, np.full(len(rows), width))):
                windows[row] = window
        crossing = np.flatnonzero(~inside)
        for row, window in zip(crossing.tolist(), self._gather(starts[crossing], self.dtype)):
            windows[row] = window
        return windows

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        starts = self._window_starts(indices)
        tokens = self._tokens(starts)
        if not self.document_starts:
            return tokens
        marks = self._document_starts(starts)
        if self.output == "torch":
            marks = torch.from_numpy(marks)
        return [{"tokens": window, "document_starts": mark} for window, mark in zip(tokens, marks)]

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, (bool, np.bool_)) or not hasattr(index, "__index__"):
            raise RecordTypeError(f"window indices are integers, not {type(index).__name__}", path=self.path)
        return self.__getitems__([index.__index__()])[0]
