"""RecordDataset: samples per codec, zero-copy numpy output, pickling by path, DataLoader workers, damaged records."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import JaggedBatch, RecordDataset, collate_jagged, collate_padded

from .helpers_torch import batch_indices, record_length, write_indexed_dataset


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch-datasets") / "data"
    write_indexed_dataset(path, 103, max_shard_records=10)
    return path


@pytest.mark.parametrize(("keep_dtype", "dtype"), [(False, torch.int64), (True, torch.int32)])
def test_ndarray_samples_are_writable_tensor_copies_of_the_records(sharded, keep_dtype, dtype):
    dataset = RecordDataset(sharded, keep_dtype=keep_dtype)
    sample = dataset[42]
    assert isinstance(sample, torch.Tensor) and sample.dtype == dtype
    assert sample.tolist() == [42] * record_length(42)
    sample[0] = -1
    assert dataset[42][0] == 42


def test_numpy_output_is_a_read_only_view_of_the_map(sharded):
    sample = RecordDataset(sharded, output="numpy")[7]
    assert isinstance(sample, np.ndarray) and not sample.flags.writeable and not sample.flags.owndata
    assert sample.tolist() == [7] * record_length(7)


def test_getitems_returns_the_batch_in_the_order_asked(sharded):
    dataset = RecordDataset(sharded)
    indices = [99, 0, 55, 55, 13]
    assert [int(sample[0]) for sample in dataset.__getitems__(indices)] == indices


def test_each_codec_becomes_tensors_or_values(tmp_path):
    with varstore.Writer(tmp_path / "bytes") as writer:
        writer.extend([b"\x00\xff", b""])
    with varstore.Writer(tmp_path / "text", codec="str") as writer:
        writer.append("héllo")
    with varstore.Writer(tmp_path / "structured", codec="msgpack") as writer:
        writer.append({"tokens": np.arange(4, dtype=np.uint16), "label": 3, "name": "a", "parts": [np.ones(2, np.float32)]})
    assert RecordDataset(tmp_path / "bytes")[0].tolist() == [0, 255]
    assert RecordDataset(tmp_path / "bytes")[1].dtype == torch.uint8
    assert RecordDataset(tmp_path / "text")[0] == "héllo"
    sample = RecordDataset(tmp_path / "structured")[0]
    assert sample["tokens"].tolist() == [0, 1, 2, 3] and sample["tokens"].dtype == torch.int64
    assert (sample["label"], sample["name"]) == (3, "a")
    assert isinstance(sample["parts"][0], torch.Tensor) and sample["parts"][0].tolist() == [1.0, 1.0]
    assert sample["parts"][0].dtype == torch.float32
    assert RecordDataset(tmp_path / "structured", keep_dtype=True)[0]["tokens"].dtype == torch.uint16


def test_deepest_structured_record_the_writer_accepts_becomes_tensors_without_a_recursion_error(tmp_path):
    record: dict = {"leaf": np.arange(3, dtype=np.int16), "order": [1, {"b": 2, "a": 1}]}
    for level in range(505):
        record = {"level": level, "inner": record}
    with varstore.Writer(tmp_path / "deep", codec="msgpack") as writer:
        writer.append(record)
    sample = RecordDataset(tmp_path / "deep")[0]
    for level in reversed(range(505)):
        assert sample["level"] == level
        sample = sample["inner"]
    assert sample["leaf"].tolist() == [0, 1, 2] and isinstance(sample["leaf"], torch.Tensor)
    assert sample["order"] == [1, {"b": 2, "a": 1}] and list(sample["order"][1]) == ["b", "a"]


def test_transform_runs_on_each_sample(sharded):
    dataset = RecordDataset(sharded, transform=lambda sample: sample.sum())
    assert [int(value) for value in dataset.__getitems__([3, 4])] == [3 * record_length(3), 4 * record_length(4)]


def test_flat_batches_read_one_jagged_batch(sharded):
    batch = RecordDataset(sharded, flat_batches=True).__getitems__([9, 10, 11])
    assert isinstance(batch, JaggedBatch)
    assert batch_indices(batch) == [9, 10, 11]
    numpy_batch = RecordDataset(sharded, flat_batches=True, output="numpy").__getitems__([9, 10, 11])
    assert batch_indices(collate_jagged(numpy_batch)) == [9, 10, 11]


def test_flat_batches_refuse_a_transform(sharded):
    with pytest.raises(varstore.VarstoreError, match="transform"):
        RecordDataset(sharded, flat_batches=True, transform=lambda sample: sample)


def test_dataset_pickles_as_its_path_without_maps(sharded):
    dataset = RecordDataset(sharded)
    dataset[0]
    payload = pickle.dumps(dataset)
    assert len(payload) < 2000
    assert pickle.loads(payload)[5].tolist() == [5] * record_length(5)


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_shuffled_loader_yields_every_record_once(sharded, workers, context):
    dataset = RecordDataset(sharded, output="numpy")
    loader = DataLoader(
        dataset, batch_size=8, shuffle=True, num_workers=workers, multiprocessing_context=context,
        collate_fn=collate_padded,
    )
    seen = [index for batch in loader for index in batch_indices(batch)]
    assert sorted(seen) == list(range(len(dataset)))
    assert seen != sorted(seen)


def test_flat_loader_with_workers_yields_every_record_once(sharded):
    loader = DataLoader(RecordDataset(sharded, flat_batches=True), batch_size=16, num_workers=2, collate_fn=collate_jagged)
    assert [index for batch in loader for index in batch_indices(batch)] == list(range(103))


def _damage_record(directory, index: int) -> str:
    """Flip one payload byte of record `index` (away from the first and last 4 KiB, which are checked at open)."""
    dataset = varstore.open(directory)
    position = int(np.searchsorted(dataset.shard_starts, index, side="right") - 1)
    shard = dataset.shard(position)
    start = int(shard.offsets[index - int(dataset.shard_starts[position])])
    with open(shard.data_path, "r+b") as file:
        file.seek(start)
        byte = file.read(1)
        file.seek(start)
        file.write(bytes([byte[0] ^ 0xFF]))
    return shard.path


@pytest.fixture
def damaged(tmp_path):
    """Two shards of 4000 records of 16 bytes; records 1500 and 1600 (shard 0) and 6000 (shard 1) are damaged."""
    with varstore.ShardedWriter(tmp_path / "data", codec="ndarray", dtype="int32", max_shard_records=4000) as writer:
        writer.extend(np.full(4, index, np.int32) for index in range(8000))
    shards = [_damage_record(tmp_path / "data", index) for index in (1500, 1600, 6000)]
    return tmp_path / "data", sorted(set(shards))


def test_damaged_record_raises_naming_the_shard_and_record_by_default(damaged):
    path, shards = damaged
    dataset = RecordDataset(path, verify_reads=True)
    with pytest.raises(varstore.CorruptRecordError, match="record 1500 checksum") as caught:
        dataset.__getitems__([1499, 1500])
    assert shards[0] in str(caught.value) and caught.value.records == [1500]


def test_skip_policy_drops_damaged_records_counts_them_and_warns_once_per_shard(damaged, caplog):
    path, shards = damaged
    dataset = RecordDataset(path, verify_reads=True, on_damaged="skip")
    with caplog.at_level(logging.WARNING, logger="varstore.torch"):
        batches = [dataset.__getitems__(range(start, start + 500)) for start in range(0, 8000, 500)]
    seen = [int(sample[0]) for batch in batches for sample in batch]
    assert seen == [index for index in range(8000) if index not in (1500, 1600, 6000)]
    assert dataset.skipped_records == {shards[0]: 2, shards[1]: 1}
    warned = Counter(shard for record in caplog.records for shard in shards if shard in record.getMessage())
    assert warned == {shards[0]: 1, shards[1]: 1}


def test_skip_policy_in_workers_still_yields_every_good_record(damaged):
    path, _ = damaged
    loader = DataLoader(
        RecordDataset(path, verify_reads=True, on_damaged="skip", output="numpy"),
        batch_size=1000, num_workers=2, collate_fn=collate_jagged,
    )
    seen = [int(batch.values[offset]) for batch in loader for offset in batch.offsets[:-1].tolist()]
    assert seen == [index for index in range(8000) if index not in (1500, 1600, 6000)]


@pytest.mark.parametrize(("context", "workers"), [("fork", 2), ("spawn", 1)])  # a spawn worker costs ~5 s here
def test_records_skipped_by_fork_or_spawn_workers_are_counted_in_the_main_process_after_the_epoch(damaged, context, workers):
    """Issue 11 item 6. With 2 workers, batch 1 (records 1500 and 1600) goes to worker 1 and batch 6 (6000) to worker 0."""
    path, shards = damaged
    dataset = RecordDataset(path, verify_reads=True, on_damaged="skip", output="numpy")
    loader = DataLoader(dataset, batch_size=1000, num_workers=workers, multiprocessing_context=context, timeout=60,
                        collate_fn=collate_jagged)
    assert sum(len(batch.offsets) - 1 for batch in loader) == 8000 - 3
    assert dataset.skipped_records == {shards[0]: 2, shards[1]: 1}


def test_skip_policy_refuses_a_batch_with_nothing_left(damaged):
    path, _ = damaged
    dataset = RecordDataset(path, verify_reads=True, on_damaged="skip")
    with pytest.raises(varstore.CorruptRecordError, match="all 2 records"):
        dataset.__getitems__([1500, 1600])


def test_single_read_of_a_damaged_record_raises_even_when_skipping(damaged):
    path, _ = damaged
    with pytest.raises(varstore.CorruptRecordError):
        RecordDataset(path, verify_reads=True, on_damaged="skip")[6000]


def test_unknown_policy_or_output_is_refused(sharded):
    with pytest.raises(varstore.VarstoreError, match="on_damaged"):
        RecordDataset(sharded, on_damaged="ignore")
    with pytest.raises(varstore.VarstoreError, match="output"):
        RecordDataset(sharded, output="jax")


def test_worker_after_fork_opens_its_own_reader(sharded):
    dataset = RecordDataset(sharded)
    parent_reader = dataset.reader
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        same = dataset.reader is parent_reader
        os.write(write_end, b"same" if same else b"own")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read_end, 4) == b"own"


def test_varstore_works_without_torch_and_varstore_torch_says_what_is_missing(sharded):
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import varstore\n"
        f"assert varstore.open({str(sharded)!r})[3].tolist() == [3] * {record_length(3)}\n"
        "try:\n    import varstore.torch\nexcept ImportError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "pip install 'varstore[torch]'" in result.stdout


def test_damaged_record_in_a_worker_reaches_the_loop_as_a_corrupt_record_error(damaged):
    path, shards = damaged
    loader = DataLoader(RecordDataset(path, verify_reads=True), batch_size=500, num_workers=2, collate_fn=collate_jagged)
    with pytest.raises(varstore.CorruptRecordError, match="record 1500 checksum") as caught:
        list(loader)
    assert shards[0] in str(caught.value)
