"""collate_padded and collate_jagged: properties over random batches, every input form, refused inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import varstore
from varstore.shard.reader import FlatBatch
from varstore.torch import JaggedBatch, PaddedBatch, collate_jagged, collate_padded


@st.composite
def batches(draw):
    """A list of 1..6 arrays of one dtype and trailing shape whose first dimension varies (0 allowed)."""
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.uint16, np.int64, np.float32, np.bool_]))
    trailing = draw(st.sampled_from([(), (2,), (1, 3)]))
    lengths = draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
    return [draw(hnp.arrays(dtype, (length, *trailing))) for length in lengths]


def _same(tensor: torch.Tensor, array: np.ndarray) -> bool:
    return tensor.shape == array.shape and np.array_equal(tensor.numpy(), array, equal_nan=array.dtype.kind == "f")


def _identical(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def _expected_dtype(sample: np.ndarray, as_tensors: bool, keep_dtype: bool) -> torch.dtype:
    """Integer numpy samples become int64 unless keep_dtype; tensors, floats and bools keep their dtype."""
    converted = not as_tensors and not keep_dtype and sample.dtype.kind in "iu"
    return torch.int64 if converted else torch.from_numpy(sample).dtype


@given(batches(), st.integers(1, 8), st.booleans(), st.booleans())
def test_padded_batch_holds_each_sample_then_padding(samples, multiple, as_tensors, keep_dtype):
    inputs = [torch.from_numpy(sample.copy()) for sample in samples] if as_tensors else samples
    batch = collate_padded(inputs, pad_value=1, pad_to_multiple=multiple, keep_dtype=keep_dtype)
    assert batch.values.dtype == _expected_dtype(samples[0], as_tensors, keep_dtype)
    lengths = [len(sample) for sample in samples]
    assert batch.values.shape[1] == math.ceil(max(lengths) / multiple) * multiple
    assert batch.lengths.tolist() == lengths
    for row, sample in enumerate(samples):
        assert _same(batch.values[row, : len(sample)], sample)
        assert (batch.values[row, len(sample) :].numpy() == 1).all()
        assert batch.mask[row].tolist() == [column < len(sample) for column in range(batch.values.shape[1])]


@given(batches(), st.booleans(), st.booleans())
def test_jagged_batch_is_the_samples_back_to_back(samples, as_tensors, keep_dtype):
    inputs = [torch.from_numpy(sample.copy()) for sample in samples] if as_tensors else samples
    batch = collate_jagged(inputs, keep_dtype=keep_dtype)
    assert batch.values.dtype == _expected_dtype(samples[0], as_tensors, keep_dtype)
    assert batch.offsets.dtype == torch.int64
    assert batch.offsets.tolist() == [0, *np.cumsum([len(sample) for sample in samples]).tolist()]
    for row, sample in enumerate(samples):
        assert _same(batch.values[batch.offsets[row] : batch.offsets[row + 1]], sample)
    assert batch.max_length == max(len(sample) for sample in samples)


@given(batches())
def test_a_batch_read_flat_collates_like_the_list_of_its_samples(samples):
    offsets = np.concatenate([[0], np.cumsum([len(sample) for sample in samples])]).astype(np.int64)
    flat = FlatBatch(np.concatenate(samples), offsets)
    jagged = collate_jagged(flat)
    for got, expected in zip(jagged, collate_jagged(samples)):
        _identical(got, expected)
    for got, expected in zip(collate_jagged(flat, keep_dtype=True), collate_jagged(samples, keep_dtype=True)):
        _identical(got, expected)
    for got, expected in zip(collate_padded(flat, pad_value=0), collate_padded(samples, pad_value=0)):
        _identical(got, expected)
    assert collate_jagged(jagged) is jagged
    for got, expected in zip(collate_padded(jagged), collate_padded(samples)):
        _identical(got, expected)


def test_dict_samples_collate_per_field():
    samples = [{"tokens": np.arange(length, dtype=np.int32), "label": length, "name": str(length)} for length in (2, 5)]
    padded = collate_padded(samples, pad_value=-1)
    assert isinstance(padded["tokens"], PaddedBatch)
    assert padded["tokens"].values.tolist() == [[0, 1, -1, -1, -1], [0, 1, 2, 3, 4]]
    assert padded["label"].tolist() == [2, 5] and padded["name"] == ["2", "5"]
    jagged = collate_jagged(samples)
    assert isinstance(jagged["tokens"], JaggedBatch) and jagged["tokens"].offsets.tolist() == [0, 2, 7]


def test_dtypes_numpy_lacks_are_padded_bit_for_bit():
    samples = [torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.tensor([3.25], dtype=torch.bfloat16)]
    batch = collate_padded(samples, pad_value=0.5)
    assert batch.values.dtype == torch.bfloat16
    assert batch.values.tolist() == [[1.5, -2.0], [3.25, 0.5]]
    assert collate_jagged(samples).values.tolist() == [1.5, -2.0, 3.25]


def test_jagged_batch_converts_to_a_nested_tensor():
    nested = collate_jagged([np.arange(3.0), np.arange(5.0)]).to_nested()
    assert [component.tolist() for component in nested.unbind()] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]


@pytest.mark.parametrize(
    ("samples", "options", "message"),
    [
        ([np.zeros((2, 3)), np.zeros((2, 4))], {}, "only the first dimension may vary"),
        ([np.zeros(2, np.int32), np.zeros(2, np.int64)], {}, "dtype"),
        ([np.zeros(2, np.uint8)], {"pad_value": -1, "keep_dtype": True}, "does not fit"),
        ([np.full(2, 2**63, np.uint64)], {}, "sample 0 holds uint64 value 9223372036854775808.*keep_dtype=True"),
        ([np.zeros(2, np.int32)], {"pad_value": 0.5}, "would become 0"),
        ([np.array(4, np.int32)], {}, "at least one dimension"),
        (["text"], {}, "expected a tensor or numpy array"),
        ([], {}, "empty batch"),
    ],
)
def test_batches_that_cannot_be_padded_faithfully_are_refused(samples, options, message):
    with pytest.raises(varstore.RecordTypeError, match=message):
        collate_padded(samples, **options)
