"""Torch datasets pin the dataset version they were built on: DataLoader workers (fork or spawn) and unpickled
copies read that version or raise DatasetReplacedError, so an epoch never mixes two versions."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import varstore
from varstore.torch import RecordDataset, RecordStream, TokenWindowDataset, collate_jagged

LOADER_TIMEOUT = 60


def write_version(directory: Path, version: int, *, count: int = 200, shard_records: int = 10) -> None:
    """Record i of version v is ``[1000 * v + i] * 3`` (int32): every sample says which version it came from."""
    with varstore.ShardedWriter(
        directory, codec="ndarray", dtype="int32", max_shard_records=shard_records, overwrite=True
    ) as writer:
        writer.extend(np.full(3, 1000 * version + index, np.int32) for index in range(count))


def loader(dataset: RecordDataset, context: str) -> DataLoader:
    return DataLoader(dataset, batch_size=5, num_workers=2, multiprocessing_context=context,
                      collate_fn=collate_jagged, timeout=LOADER_TIMEOUT)


def versions_of(batch) -> set[int]:
    return {int(value) // 1000 for value in batch.values[batch.offsets[:-1]].tolist()}


def test_workers_refuse_a_dataset_replaced_after_the_dataset_was_built(tmp_path):
    write_version(tmp_path / "data", 1)
    dataset = RecordDataset(tmp_path / "data", output="numpy")
    write_version(tmp_path / "data", 2, count=300)  # before any worker starts: every worker finds version 2
    with pytest.raises(varstore.DatasetReplacedError, match="replaced after this reader opened it"):
        next(iter(loader(dataset, "fork")))


def test_overwrite_during_an_epoch_yields_old_records_then_refuses(tmp_path):
    write_version(tmp_path / "data", 1)
    seen: set[int] = set()
    batches = iter(loader(RecordDataset(tmp_path / "data", output="numpy"), "fork"))
    seen |= versions_of(next(batches))  # the workers have opened version 1 and mapped its first shards
    write_version(tmp_path / "data", 2)
    with pytest.raises(varstore.DatasetReplacedError):
        for batch in batches:  # 2 workers x 2 prefetched batches run ahead; later shards are opened after the overwrite
            seen |= versions_of(batch)
    assert seen == {1}


def test_dataset_built_on_a_relative_path_reads_the_same_files_after_chdir(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_version(tmp_path / "a" / "data", 1)
    write_version(tmp_path / "b" / "data", 2)
    monkeypatch.chdir(tmp_path / "a")
    dataset = RecordDataset("data", output="numpy")
    monkeypatch.chdir(tmp_path / "b")
    assert dataset.path == str(tmp_path / "a" / "data")
    assert pickle.loads(pickle.dumps(dataset))[7].tolist() == [1007] * 3


def test_token_windows_and_stream_copies_refuse_a_replaced_dataset(tmp_path):
    write_version(tmp_path / "data", 1)
    windows = pickle.dumps(TokenWindowDataset(tmp_path / "data", seq_len=8))
    stream = pickle.dumps(RecordStream(tmp_path / "data", batch_size=4, output="numpy"))
    write_version(tmp_path / "data", 2)
    with pytest.raises(varstore.DatasetReplacedError):
        pickle.loads(windows)[0]
    with pytest.raises(varstore.DatasetReplacedError):
        next(iter(pickle.loads(stream)))
