"""RecordStream: exactly once across ranks and workers, an order independent of the worker count, exact resumption."""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import varstore
from varstore.torch import RecordStream, collate_jagged
from varstore.torch.stream import _EpochOrder

from .helpers_torch import batch_indices, write_indexed_dataset

SIZES = (0, 1, 23, 150)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Indexed datasets of each size in SIZES, in shards of 17 records."""
    root = tmp_path_factory.mktemp("torch-stream")
    for size in SIZES:
        write_indexed_dataset(root / str(size), size, max_shard_records=17)
    return {size: root / str(size) for size in SIZES}


def first_values(samples: list[np.ndarray]) -> list[int]:
    """A collate_fn naming each record of an indexed dataset by its value."""
    return [int(sample[0]) for sample in samples]


def as_worker(stream: RecordStream, worker: int, workers: int) -> list[list[int]]:
    """The batches `stream` yields as DataLoader worker `worker` of `workers`, from its own pickled copy."""
    copy = pickle.loads(pickle.dumps(stream))
    with patch("varstore.torch.stream.get_worker_info", return_value=SimpleNamespace(id=worker, num_workers=workers)):
        return list(copy)


def delivered(stream: RecordStream, workers: int) -> list[list[int]]:
    """What an in-order DataLoader returns: one batch from each worker in turn, skipping workers that are done."""
    queues = [as_worker(stream, worker, workers) for worker in range(workers)]
    batches = []
    while any(queues):
        for queue in queues:
            if queue:
                batches.append(queue.pop(0))
    return batches


def stream_settings(data):
    return {
        "batch_size": data.draw(st.integers(1, 9), label="batch_size"),
        "block_size": data.draw(st.integers(1, 20), label="block_size"),
        "shuffle_window": data.draw(st.integers(1, 40), label="shuffle_window"),
        "shuffle": data.draw(st.booleans(), label="shuffle"),
        "seed": 11,
        "collate_fn": first_values,
        "output": "numpy",
    }


@given(st.sampled_from(SIZES), st.integers(1, 3), st.integers(1, 4), st.data())
def test_every_record_once_per_epoch_across_ranks_and_workers_in_a_worker_independent_order(
    datasets, size, world_size, workers, data
):
    settings = stream_settings(data)
    seen = []
    for rank in range(world_size):
        stream = RecordStream(datasets[size], rank=rank, world_size=world_size, **settings)
        stream.set_epoch(2)
        batches = delivered(stream, workers)
        assert batches == list(stream)
        assert len(batches) == len(stream)
        assert all(len(batch) == settings["batch_size"] for batch in batches[:-1])
        seen += [index for batch in batches for index in batch]
    assert sorted(seen) == list(range(size))


@given(st.sampled_from(SIZES[1:]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.data())
def test_resume_after_any_number_of_batches_continues_the_epoch_exactly(
    datasets, size, world_size, workers, new_workers, data
):
    settings = stream_settings(data)
    streams = [RecordStream(datasets[size], rank=rank, world_size=world_size, **settings) for rank in range(world_size)]
    for stream in streams:
        stream.set_epoch(1)
    uninterrupted = [delivered(stream, workers) for stream in streams]
    steps = data.draw(st.integers(0, len(uninterrupted[0])), label="steps")
    states = [stream.state_dict(steps * settings["batch_size"]) for stream in streams]
    assert all(state == states[0] for state in states)
    for rank, stream in enumerate(streams):
        fresh = RecordStream(datasets[size], rank=rank, world_size=world_size, **settings)
        fresh.load_state_dict(states[0])
        fresh.set_epoch(1)
        resumed = delivered(fresh, new_workers)
        assert uninterrupted[rank][:steps] + resumed == uninterrupted[rank]


@given(st.sampled_from(SIZES), st.integers(1, 3), st.data())
def test_prefetched_ranges_are_exactly_the_records_each_window_reads(datasets, size, world_size, data):
    settings = stream_settings(data)
    for rank in range(world_size):
        prefetched: list[tuple[int, int]] = []
        order = _EpochOrder(RecordStream(datasets[size], rank=rank, world_size=world_size, **settings),
                            lambda start, stop: prefetched.append((start, stop)))
        for start in range(0, order.count, order.shuffle_window):
            prefetched.clear()
            records = order.records(start, min(start + order.shuffle_window, order.count))
            assert [index for run in prefetched for index in range(*run)] == sorted(records.tolist())


def test_epochs_change_the_order_and_shuffling_leaves_contiguous_blocks(datasets):
    stream = RecordStream(
        datasets[150], batch_size=150, block_size=10, shuffle_window=1, collate_fn=first_values, output="numpy"
    )
    first = list(stream)
    assert first == list(stream)
    stream.set_epoch(1)
    second = list(stream)
    assert first != second and sorted(first[0]) == sorted(second[0]) == list(range(150))
    assert sorted(first[0][:10]) == list(range(first[0][0] - first[0][0] % 10, first[0][0] - first[0][0] % 10 + 10))


def test_real_loader_with_workers_returns_the_rank_order_and_resumes_with_fewer_workers(datasets):
    options = {"batch_size": 8, "block_size": 4, "shuffle_window": 32, "collate_fn": collate_jagged, "output": "numpy"}
    stream = RecordStream(datasets[150], **options)
    uninterrupted = [batch_indices(batch) for batch in DataLoader(stream, batch_size=None, num_workers=2)]
    assert uninterrupted == [batch_indices(batch) for batch in stream]
    interrupted = []
    for batch in DataLoader(stream, batch_size=None, num_workers=2):
        interrupted.append(batch_indices(batch))
        if len(interrupted) == 7:
            break
    state = stream.state_dict(7 * 8)
    fresh = RecordStream(datasets[150], **options)
    fresh.load_state_dict(state)
    resumed = [batch_indices(batch) for batch in DataLoader(fresh, batch_size=None, num_workers=1)]
    assert interrupted + resumed == uninterrupted


def test_resume_refuses_other_settings_or_a_partial_batch(datasets):
    # Another world size resumes now (tests/test_torch_resume_world_size.py).
    stream = RecordStream(datasets[150], batch_size=8, rank=0, world_size=2)
    state = stream.state_dict(16)
    with pytest.raises(varstore.VarstoreError, match="block_size: saved 256, now 4"):
        RecordStream(datasets[150], batch_size=8, block_size=4, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(varstore.VarstoreError, match="kind"):
        stream.load_state_dict({"kind": "ExactlyOnceSampler"})
    with pytest.raises(varstore.VarstoreError, match="whole batches of 8"):
        stream.state_dict(15)


def test_skipped_damaged_record_shortens_its_batch_and_nothing_else(tmp_path):
    write_indexed_dataset(tmp_path / "data", 2000)
    reader = varstore.open(tmp_path / "data")
    start = int(reader.offsets[1000])
    with open(reader.data_path, "r+b") as file:
        file.seek(start)
        file.write(b"\xff")
    options = {"batch_size": 50, "block_size": 16, "collate_fn": first_values, "output": "numpy", "verify_reads": True}
    with pytest.raises(varstore.CorruptRecordError, match="record 1000"):
        list(RecordStream(tmp_path / "data", **options))
    batches = list(RecordStream(tmp_path / "data", on_damaged="skip", **options))
    assert sorted(len(batch) for batch in batches) == [49] + [50] * 39
    assert sorted(index for batch in batches for index in batch) == [index for index in range(2000) if index != 1000]


def test_records_skipped_by_stream_workers_are_counted_in_the_main_process_after_the_epoch(tmp_path):
    # 1 KiB records, 20 per shard: records 4-15 of a shard lie outside the edges that opening checks.
    with varstore.ShardedWriter(tmp_path / "data", codec="ndarray", dtype="int32", max_shard_records=20) as writer:
        writer.extend(np.full(256, index, np.int32) for index in range(80))
    dataset = varstore.open(tmp_path / "data")
    for index in (9, 70, 71):
        with open(dataset.shard(index // 20).data_path, "r+b") as data:
            data.seek(1024 * (index % 20) + 5)
            data.write(b"\xff")
    stream = RecordStream(tmp_path / "data", batch_size=8, block_size=4, collate_fn=first_values, output="numpy",
                          verify_reads=True, on_damaged="skip")
    loader = DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    assert sorted(index for batch in loader for index in batch) == [i for i in range(80) if i not in (9, 70, 71)]
    assert stream.skipped_records == {dataset.shard_paths[0]: 1, dataset.shard_paths[3]: 2}


def test_a_worker_starting_the_same_epoch_twice_warns_about_persistent_workers(datasets, caplog):
    stream = pickle.loads(pickle.dumps(RecordStream(datasets[23], batch_size=4, collate_fn=first_values, output="numpy")))
    with patch("varstore.torch.stream.get_worker_info", return_value=SimpleNamespace(id=0, num_workers=1)):
        with caplog.at_level(logging.WARNING, logger="varstore.torch"):
            list(stream)
            assert not caplog.records
            list(stream)
    assert "persistent_workers" in caplog.text


def test_dataset_prefetch_asks_each_shard_for_its_part_of_the_range(datasets):
    dataset = varstore.open(datasets[150])
    asked = []
    with patch("varstore.shard.reader.Reader.prefetch", lambda shard, start, stop: asked.append((shard.path, start, stop))):
        dataset.prefetch(10, 40)
        dataset.prefetch(-5, 1000)
        dataset.prefetch(30, 30)
    shard = dataset.shard_paths
    assert asked == [(shard[0], 10, 17), (shard[1], 0, 17), (shard[2], 0, 6), (shard[8], 9, 14)]


@given(st.sampled_from(SIZES[1:]), st.integers(1, 3), st.integers(1, 3), st.data())
def test_a_second_resume_continues_from_the_first_resumes_position(datasets, size, world_size, workers, data):
    """Checkpoint, resume, checkpoint again, resume again: the three runs together deliver each rank's epoch
    exactly once, in order (a state taken after a resume counts the samples consumed before it too)."""
    settings = stream_settings(data)
    for rank in range(world_size):
        def fresh() -> RecordStream:
            stream = RecordStream(datasets[size], rank=rank, world_size=world_size, **settings)
            stream.set_epoch(1)
            return stream

        uninterrupted = delivered(fresh(), workers)
        first_steps = data.draw(st.integers(0, len(uninterrupted)), label="first_steps")
        second = fresh()
        second.load_state_dict(fresh().state_dict(first_steps * settings["batch_size"]))
        resumed = delivered(second, workers)
        second_steps = data.draw(st.integers(0, len(resumed)), label="second_steps")
        consumed = min(second_steps * settings["batch_size"], sum(map(len, resumed[:second_steps])))
        third = fresh()
        third.load_state_dict(second.state_dict(consumed))
        assert uninterrupted[:first_steps] + resumed[:second_steps] + delivered(third, workers) == uninterrupted
