"""on_damaged="skip" quarantines whole shards that cannot be opened (a damaged index header, a truncated data
file): their records are skipped, counted across all DataLoader workers (fork and spawn) and warned about once,
and the rest of the dataset trains."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import RecordDataset, RecordStream, collate_jagged

SHARD_RECORDS = 50
LOADER_TIMEOUT = 60


@pytest.fixture
def two_bad_shards(tmp_path: Path) -> tuple[Path, list[str], list[int]]:
    """Four shards of 50 records (record i is [i, i, i]); shard 1's header is damaged, shard 2's data file truncated."""
    directory = tmp_path / "data"
    with varstore.ShardedWriter(directory, codec="ndarray", dtype="int32", max_shard_records=SHARD_RECORDS) as writer:
        writer.extend(np.full(3, index, np.int32) for index in range(4 * SHARD_RECORDS))
    shards = varstore.open(directory).shard_paths
    with open(shards[1] + ".index", "r+b") as index:
        index.seek(30)
        byte = index.read(1)
        index.seek(30)
        index.write(bytes([byte[0] ^ 0x01]))  # inside the record count: the header checksum fails
    os.truncate(shards[2] + ".data", 100)
    good = [index for index in range(4 * SHARD_RECORDS) if index // SHARD_RECORDS in (0, 3)]
    return directory, [shards[1], shards[2]], good


def read_epoch(dataset: RecordDataset, **options) -> list[int]:
    loader = DataLoader(dataset, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0),
                        collate_fn=collate_jagged, **options)
    return sorted(int(batch.values[start]) for batch in loader for start in batch.offsets[:-1].tolist())


def test_skip_trains_on_the_rest_and_workers_report_quarantined_shards_to_the_main_process(two_bad_shards):
    directory, bad, good = two_bad_shards
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip")
    assert len(dataset) == 4 * SHARD_RECORDS
    assert read_epoch(dataset, num_workers=2, multiprocessing_context="fork", timeout=LOADER_TIMEOUT) == good
    assert dataset.skipped_records == {bad[0]: SHARD_RECORDS, bad[1]: SHARD_RECORDS}
    assert read_epoch(dataset, num_workers=2, multiprocessing_context="fork", timeout=LOADER_TIMEOUT) == good
    assert dataset.skipped_records == {bad[0]: 2 * SHARD_RECORDS, bad[1]: 2 * SHARD_RECORDS}


def test_skipped_counts_of_a_spawn_worker_reach_the_main_process(two_bad_shards):
    directory, bad, good = two_bad_shards
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip")
    assert read_epoch(dataset, num_workers=1, multiprocessing_context="spawn", timeout=LOADER_TIMEOUT) == good
    assert dataset.skipped_records == {bad[0]: SHARD_RECORDS, bad[1]: SHARD_RECORDS}


def test_each_quarantined_shard_is_named_in_one_warning(two_bad_shards, caplog):
    directory, bad, good = two_bad_shards
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip")
    with caplog.at_level(logging.WARNING, logger="varstore.torch"):
        assert read_epoch(dataset) == good
        assert read_epoch(dataset) == good
    messages = [record.getMessage() for record in caplog.records]
    assert [sum(shard in message for message in messages) for shard in bad] == [1, 1]
    assert any("header checksum" in message for message in messages)


def test_stream_skips_quarantined_shards_and_counts_them(two_bad_shards):
    directory, bad, good = two_bad_shards
    stream = RecordStream(directory, batch_size=16, block_size=8, output="numpy", on_damaged="skip",
                          collate_fn=collate_jagged)
    seen = sorted(int(batch.values[start]) for batch in stream for start in batch.offsets[:-1].tolist())
    assert seen == good
    assert stream.skipped_records == {bad[0]: SHARD_RECORDS, bad[1]: SHARD_RECORDS}


def test_damaged_shards_still_raise_without_skip(two_bad_shards):
    directory, _, _ = two_bad_shards
    with pytest.raises(varstore.FormatError, match="shard-000001.index: header checksum"):
        RecordDataset(directory)


def test_shard_with_a_damaged_header_is_skipped_instead_of_aborting_the_epoch(tmp_path):
    directory = tmp_path / "data"
    with varstore.ShardedWriter(directory, codec="ndarray", dtype="int32", max_shard_records=SHARD_RECORDS) as writer:
        writer.extend(np.full(3, index, np.int32) for index in range(3 * SHARD_RECORDS))
    bad = varstore.open(directory).shard_paths[1]
    with open(bad + ".index", "r+b") as index:
        index.seek(8)
        index.write(b"\x07")  # the major version: the header checksum fails before it is read
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip")
    assert read_epoch(dataset) == [index for index in range(3 * SHARD_RECORDS) if index // SHARD_RECORDS != 1]
    assert dataset.skipped_records == {bad: SHARD_RECORDS}


def test_damaged_records_skipped_in_workers_are_counted_in_the_main_process(tmp_path):
    # 1 KiB records, 20 per shard: records 4-15 of a shard lie outside the edges that opening checks.
    directory = tmp_path / "data"
    with varstore.ShardedWriter(directory, codec="ndarray", dtype="int32", max_shard_records=20) as writer:
        writer.extend(np.full(256, index, np.int32) for index in range(40))
    shards = varstore.open(directory).shard_paths
    for shard, local in ((shards[0], 9), (shards[1], 10), (shards[1], 11)):
        with open(shard + ".data", "r+b") as data:
            data.seek(1024 * local + 5)
            data.write(b"\xff")
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip", verify_reads=True)
    seen = read_epoch(dataset, num_workers=2, multiprocessing_context="fork", timeout=LOADER_TIMEOUT)
    assert seen == [index for index in range(40) if index not in (9, 30, 31)]
    assert dataset.skipped_records == {shards[0]: 1, shards[1]: 2}


def test_an_os_error_while_mapping_a_shard_raises_and_never_quarantines_it(tmp_path, monkeypatch):
    """Running out of file descriptors says nothing about the shard: the read fails, and the next one succeeds."""
    directory = tmp_path / "data"
    with varstore.ShardedWriter(directory, codec="ndarray", dtype="int32", max_shard_records=SHARD_RECORDS) as writer:
        writer.extend(np.full(3, index, np.int32) for index in range(2 * SHARD_RECORDS))
    dataset = RecordDataset(directory, output="numpy", on_damaged="skip")
    import varstore.dataset.local_source as sharded_reader

    real_open = sharded_reader.open_listed_shard
    failures = iter([True])

    def open_once_out_of_descriptors(*args, **options):
        if next(failures, False):
            raise varstore.StorageError("cannot open: Too many open files", path=str(args[0]))
        return real_open(*args, **options)

    monkeypatch.setattr(sharded_reader, "open_listed_shard", open_once_out_of_descriptors)
    with pytest.raises(varstore.StorageError, match="Too many open files"):
        dataset.__getitems__([0, 1])
    assert [int(sample[0]) for sample in dataset.__getitems__(list(range(2 * SHARD_RECORDS)))] == list(range(2 * SHARD_RECORDS))
    assert dataset.skipped_records == {}
