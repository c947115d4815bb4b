"""Batches of ndarray records become tensors with one conversion per batch, and tensor samples collate with one
``torch.cat`` (issue 15: the DataLoader's per-sample conversions made varstore's 0-worker loader 0.27x the floor's).

Each fast path is held to what the per-sample path gives: the same values, dtypes and shapes, the same errors
naming the same record or sample, tensors that are writable and independent of each other and of the map.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.torch import RecordDataset, collate_jagged, collate_padded

DTYPES = ["|u1", "<u2", "<i4", "<i8", "<u8", "<f4", "<f8", "|b1"]


def write_arrays(path, dtype: str, trailing: tuple[int, ...], records: list[np.ndarray]) -> None:
    with varstore.Writer(path, codec="ndarray", dtype=dtype, shape=trailing) as writer:
        writer.extend(records)


@st.composite
def array_datasets(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    elements = st.integers(0, 2**63 - 1) if dtype == np.uint64 else None  # values int64 tensors can hold
    lengths = draw(st.lists(st.integers(0, 5), min_size=1, max_size=6))
    records = [draw(hnp.arrays(dtype, (length, *trailing), elements=elements)) for length in lengths]
    indices = draw(st.lists(st.integers(0, len(records) - 1), min_size=1, max_size=10))
    return dtype.str, trailing, records, indices


@given(array_datasets(), st.booleans())
def test_a_batch_holds_the_samples_single_reads_give(tmp_path_factory, case, keep_dtype):
    dtype, trailing, records, indices = case
    path = tmp_path_factory.mktemp("arrays") / "shard"
    write_arrays(path, dtype, trailing, records)
    dataset = RecordDataset(path, keep_dtype=keep_dtype)
    batch = dataset.__getitems__(indices)
    assert len(batch) == len(indices)
    for index, sample in zip(indices, batch):
        alone = dataset[index]
        assert sample.dtype == alone.dtype and sample.shape == alone.shape == records[index].shape
        assert np.array_equal(sample.numpy(), alone.numpy(), equal_nan=True)
        assert np.array_equal(sample.numpy().astype(records[index].dtype), records[index], equal_nan=True)


def test_samples_of_a_batch_are_writable_and_independent(tmp_path):
    write_arrays(tmp_path / "shard", "<i4", (), [np.arange(4, dtype=np.int32), np.arange(3, dtype=np.int32)])
    dataset = RecordDataset(tmp_path / "shard", keep_dtype=True)  # no dtype conversion: the copy must come from the batch
    first, again, second = dataset.__getitems__([0, 0, 1])
    first += 100
    assert again.tolist() == [0, 1, 2, 3] and second.tolist() == [0, 1, 2]
    assert dataset[0].tolist() == [0, 1, 2, 3]


def test_a_uint64_value_int64_cannot_hold_names_the_same_record_in_a_batch_as_alone(tmp_path):
    write_arrays(tmp_path / "ids", "<u8", (2,), [np.zeros((1, 2), np.uint64), np.zeros((2, 2), np.uint64),
                                                np.array([[0, 2**63]], np.uint64)])
    dataset = RecordDataset(tmp_path / "ids")
    message = "record 2 holds uint64 value 9223372036854775808"
    with pytest.raises(varstore.RecordTypeError, match=message):
        dataset[2]
    with pytest.raises(varstore.RecordTypeError, match=message):
        dataset.__getitems__([1, 2, 0])
    assert [sample.shape for sample in dataset.__getitems__([1, 0])] == [(2, 2), (1, 2)]


def test_a_transform_sees_each_sample_of_a_batch(tmp_path):
    write_arrays(tmp_path / "shard", "<i4", (), [np.arange(length, dtype=np.int32) for length in (1, 4, 2)])
    dataset = RecordDataset(tmp_path / "shard", transform=lambda sample: (sample.dtype, int(sample.sum())))
    assert dataset.__getitems__([1, 2, 0]) == [(torch.int64, 6), (torch.int64, 1), (torch.int64, 0)]


TENSOR_DTYPES = [torch.uint8, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64, torch.bool,
                 torch.bfloat16, torch.float16]


@st.composite
def tensor_batches(draw):
    dtype = draw(st.sampled_from(TENSOR_DTYPES))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    samples = [(torch.rand((length, *trailing), generator=generator) * 100).to(dtype) for length in lengths]
    return samples, lengths


@given(tensor_batches(), st.booleans())
def test_tensor_samples_collate_to_their_concatenation(batch, keep_dtype):
    samples, lengths = batch
    jagged = collate_jagged(samples, keep_dtype=keep_dtype)
    assert jagged.values.dtype == samples[0].dtype
    assert torch.equal(jagged.values, torch.cat(samples))
    assert jagged.offsets.tolist() == np.concatenate(([0], np.cumsum(lengths))).tolist()
    padded = collate_padded(samples, keep_dtype=keep_dtype)
    for row, (sample, length) in enumerate(zip(samples, lengths)):
        assert torch.equal(padded.values[row, :length], sample)
        assert int(padded.lengths[row]) == length and padded.mask[row].sum() == length


def test_tensors_needing_grad_collate_detached():
    samples = [torch.ones(2, requires_grad=True), torch.zeros(1, requires_grad=True)]
    jagged = collate_jagged(samples)
    assert not jagged.values.requires_grad and jagged.values.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "samples, message",
    [
        ([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], "sample 1 has dtype float64"),
        ([torch.zeros((2, 3)), torch.zeros((2, 4))], "only the first dimension may vary"),
        ([torch.zeros(2), torch.tensor(1.0)], "sample 1 is a scalar"),
        ([torch.zeros(2), [1.0]], "sample 1 is a list"),
    ],
)
def test_tensor_samples_that_disagree_are_refused_naming_the_sample(samples, message):
    with pytest.raises(varstore.RecordTypeError, match=message):
        collate_jagged(samples)


def test_a_tensor_subclass_collates_as_before():
    samples = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(3))]
    assert collate_jagged(samples).values.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
