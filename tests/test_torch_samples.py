"""Samples as a first user meets them: nested msgpack fields, uint64 beside tokens, RecordStream's default collation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import RecordDataset, RecordStream, collate_jagged, collate_padded


@pytest.fixture
def nested(tmp_path):
    path = tmp_path / "nested"
    with varstore.ShardedWriter(path, codec="msgpack") as writer:
        for length in (3, 5):
            codes = np.arange(10, 10 + length, dtype=np.uint16)
            frames = np.ones(2 * length, np.float32)
            writer.append({
                "tokens": np.arange(length, dtype=np.uint16),
                "audio": {"codes": codes, "rate": 16000, "meta": {"frames": frames}},
            })
    return path


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_variable_length_arrays_in_nested_maps_are_padded_like_top_level_fields(nested, output):
    dataset = RecordDataset(nested, output=output)
    batch = collate_padded(dataset.__getitems__([0, 1]), pad_value=-1)
    codes = batch["audio"]["codes"]
    assert codes.values.dtype == torch.int64
    assert codes.values.tolist() == [[10, 11, 12, -1, -1], [10, 11, 12, 13, 14]]
    assert codes.lengths.tolist() == [3, 5] and codes.mask.sum().item() == 8
    assert batch["audio"]["meta"]["frames"].values.shape == (2, 10)
    assert batch["audio"]["rate"].tolist() == [16000, 16000]
    assert batch["tokens"].lengths.tolist() == [3, 5]


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_variable_length_arrays_in_nested_maps_are_jagged_like_top_level_fields(nested, output):
    batch = collate_jagged(RecordDataset(nested, output=output).__getitems__([0, 1]))
    codes = batch["audio"]["codes"]
    assert codes.values.tolist() == [10, 11, 12, 10, 11, 12, 13, 14] and codes.offsets.tolist() == [0, 3, 8]
    assert batch["audio"]["meta"]["frames"].offsets.tolist() == [0, 6, 16]


def test_nested_fields_that_disagree_are_refused_naming_the_dotted_field():
    first = {"audio": {"codes": np.arange(3), "meta": {"frames": np.zeros(2, np.float32)}}}
    other_keys = {"audio": {"codes": np.arange(4), "meta": {"count": 1}}}
    with pytest.raises(varstore.RecordTypeError, match=r"sample 1, field audio.meta has fields \['count'\]"):
        collate_padded([first, other_keys])
    other_dtype = {"audio": {"codes": np.arange(4), "meta": {"frames": np.zeros(2, np.float64)}}}
    with pytest.raises(varstore.RecordTypeError, match="sample 1, field audio.meta.frames has dtype float64"):
        collate_jagged([first, other_dtype])
    not_a_map = {"audio": None}
    with pytest.raises(varstore.RecordTypeError, match="sample 1, field audio has fields a NoneType"):
        collate_jagged([first, not_a_map])


@pytest.fixture
def tokens_with_hash(tmp_path):
    path = tmp_path / "hashed"
    with varstore.ShardedWriter(path, codec="msgpack") as writer:
        writer.append({"tokens": np.array([1, 2], np.uint16), "meta": {"hash": np.array([2**63 - 1], np.uint64)}})
        writer.append({"tokens": np.array([3], np.uint16), "meta": {"hash": np.array([2**63 + 5], np.uint64)}})
    return path


def test_uint64_field_that_fits_int64_does_not_stop_tokens_becoming_int64(tokens_with_hash):
    sample = RecordDataset(tokens_with_hash)[0]
    assert sample["tokens"].dtype == torch.int64 and sample["meta"]["hash"].tolist() == [2**63 - 1]
    assert torch.nn.Embedding(10, 2)(sample["tokens"]).shape == (2, 2)
    batch = collate_jagged(RecordDataset(tokens_with_hash, output="numpy").__getitems__([0]))
    assert batch["meta"]["hash"].values.dtype == torch.int64 and batch["meta"]["hash"].values.tolist() == [2**63 - 1]


def test_uint64_field_int64_cannot_hold_is_refused_naming_dataset_record_and_field(tokens_with_hash):
    expected = r"record 1, field meta.hash holds uint64 value 9223372036854775813"
    with pytest.raises(varstore.RecordTypeError, match=expected) as refused:
        RecordDataset(tokens_with_hash)[-1]
    assert str(tokens_with_hash) in str(refused.value) and "keep_dtype=True" in str(refused.value)
    with pytest.raises(varstore.RecordTypeError, match="record 1, field meta.hash"):
        RecordDataset(tokens_with_hash).__getitems__([0, 1])
    with pytest.raises(varstore.RecordTypeError, match="sample 1, field meta.hash holds uint64"):
        collate_padded(RecordDataset(tokens_with_hash, output="numpy").__getitems__([0, 1]))
    kept = RecordDataset(tokens_with_hash, keep_dtype=True)[1]
    assert kept["meta"]["hash"].dtype == torch.uint64 and kept["meta"]["hash"].tolist() == [2**63 + 5]


def test_flat_uint64_batch_int64_cannot_hold_is_refused_naming_the_record(tmp_path):
    with varstore.Writer(tmp_path / "ids", codec="ndarray", dtype="uint64", shape=(2,)) as writer:
        writer.extend([np.zeros((1, 2), np.uint64), np.zeros((2, 2), np.uint64), np.array([[0, 2**63]], np.uint64)])
    dataset = RecordDataset(tmp_path / "ids", flat_batches=True)
    assert dataset.__getitems__([0, 1]).values.dtype == torch.int64
    with pytest.raises(varstore.RecordTypeError, match="record 2 holds uint64 value 9223372036854775808"):
        dataset.__getitems__([1, 0, 2])


def write_lengths(path, lengths):
    with varstore.Writer(path, codec="ndarray", dtype="uint16") as writer:
        writer.extend(np.full(length, length, np.uint16) for length in lengths)


def test_record_stream_default_collation_stacks_equal_samples_and_tuples_from_a_transform(tmp_path):
    """The default is torch's default_collate: equal-length records stack, (tokens, label) tuples collate."""
    write_lengths(tmp_path / "docs", [3, 3, 3])
    (batch,) = list(RecordStream(tmp_path / "docs", batch_size=3, shuffle=False))
    assert batch.shape == (3, 3) and batch.dtype == torch.int64
    stream = RecordStream(tmp_path / "docs", batch_size=3, shuffle=False, transform=lambda record: (record, len(record)))
    (tokens, labels), = list(stream)
    assert tokens.shape == (3, 3) and labels.tolist() == [3, 3, 3]
    with varstore.Writer(tmp_path / "text", codec="str") as writer:
        writer.extend(["a", "bc"])
    assert list(RecordStream(tmp_path / "text", batch_size=2, shuffle=False)) == [["a", "bc"]]


def test_record_stream_default_collation_of_different_lengths_names_the_collate_functions(tmp_path, nested):
    write_lengths(tmp_path / "docs", [1, 4, 2])
    with pytest.raises(varstore.VarstoreError, match="different lengths.*collate_fn=collate_jagged"):
        list(RecordStream(tmp_path / "docs", batch_size=3, shuffle=False))
    (batch,) = list(RecordStream(tmp_path / "docs", batch_size=3, shuffle=False, collate_fn=collate_jagged))
    assert batch.lengths.tolist() == [1, 4, 2]
    (batch,) = list(RecordStream(nested, batch_size=2, shuffle=False, collate_fn=collate_jagged))
    assert batch["audio"]["codes"].offsets.tolist() == [0, 3, 8]


def test_pad_to_multiple_below_one_is_a_bad_value_not_a_type_error():
    with pytest.raises(varstore.VarstoreError, match="pad_to_multiple must be at least 1, not 0") as refused:
        collate_padded([np.zeros(2, np.int32)], pad_to_multiple=0)
    assert not isinstance(refused.value, TypeError)
