"""A `RecordStream`'s batch of samples crosses from a DataLoader worker as one buffer too: ``batch_size=None``
passes each batch through `default_convert`, which copies lists, and a `SampleBatch`'s copy stays one (of the same
buffer), so the worker sends it as a `SampleBatch`, not one shared-memory segment per sample, and the loop gets the
samples 0 workers give."""

from __future__ import annotations

import copy
import operator
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_convert

from varstore.torch import RecordStream
from varstore.torch.collate import SampleBatch

from .test_worker_handoff import (
    LOADER_SAFETY_NET_S, WORKER_TEST_TIMEOUT, assert_independent, assert_same_samples, record_lengths, write_records,
)


def _as_list(batch: list) -> list:
    return batch


def stream_batches(path: Path, shuffle: bool, workers: int) -> list:
    stream = RecordStream(path, batch_size=3, collate_fn=_as_list, shuffle=shuffle, block_size=2, shuffle_window=5)
    loader = DataLoader(stream, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None,
                        timeout=LOADER_SAFETY_NET_S if workers else 0)
    return list(loader)


@pytest.mark.timeout(WORKER_TEST_TIMEOUT)
@pytest.mark.parametrize("codec", ["ndarray", "bytes"])
@settings(max_examples=8)
@given(lengths=record_lengths, shuffle=st.booleans())
def test_stream_workers_hand_over_sample_batches_with_the_samples_0_workers_give(
    codec: str, lengths: list[int], shuffle: bool
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        write_records(Path(directory) / "data", codec, lengths)
        got = stream_batches(Path(directory) / "data", shuffle, 2)
        assert_same_samples(got, stream_batches(Path(directory) / "data", shuffle, 0))
        for batch in got:
            assert_independent(batch)


def test_a_received_stream_batch_is_one_buffer_cut_into_its_samples(tmp_path: Path) -> None:
    records = write_records(tmp_path / "data", "ndarray", [3, 0, 5])
    (batch,) = stream_batches(tmp_path / "data", False, 1)
    assert type(batch) is SampleBatch and batch.flat() is not None
    start, row = batch[0].data_ptr(), 2 * 8  # int64 rows of 2, back to back
    assert batch[2].data_ptr() == start + 3 * row
    assert [sample.tolist() for sample in batch] == [record.tolist() for record in records]


def test_a_copy_of_a_sample_batch_is_one_of_the_same_buffer_until_changed(tmp_path: Path) -> None:
    write_records(tmp_path / "data", "ndarray", [2, 4, 1])
    batch = RecordStream(tmp_path / "data", batch_size=3, collate_fn=_as_list, shuffle=False).__iter__().__next__()
    converted = default_convert(batch)
    assert type(converted) is SampleBatch and converted is not batch
    assert len(converted) == len(batch) and all(map(operator.is_, converted, batch))
    assert converted.flat().values is batch.values
    converted.append(torch.zeros((1, 2), dtype=torch.int64))
    assert converted.flat() is None and batch.flat() is not None and len(batch) == 3
    changed = copy.copy(converted)
    assert len(changed) == 4 and all(map(operator.is_, changed, converted)) and changed.flat() is None
