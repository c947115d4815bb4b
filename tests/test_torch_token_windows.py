"""TokenWindowDataset: windows are exact slices of the token stream, across documents and shards."""

from __future__ import annotations

import struct
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import varstore
from varstore.torch import ExactlyOnceSampler, TokenWindowDataset

documents_strategy = st.lists(st.integers(0, 12), min_size=0, max_size=12).map(
    lambda lengths: [np.arange(sum(lengths[:k]), sum(lengths[: k + 1])) for k in range(len(lengths))]
)


def write_tokens(path, documents, dtype="uint16", max_shard_records=None) -> None:
    """Documents as records; one shard unless `max_shard_records` makes a dataset directory."""
    arrays = [np.asarray(document, dtype) for document in documents]
    if max_shard_records is None:
        with varstore.Writer(path, codec="ndarray", dtype=dtype) as writer:
            writer.extend(arrays)
    else:
        with varstore.ShardedWriter(path, codec="ndarray", dtype=dtype, max_shard_records=max_shard_records) as writer:
            writer.extend(arrays)


@pytest.mark.parametrize("output", ["torch", "numpy"])
@given(documents_strategy, st.integers(1, 9), st.sampled_from([None, 1, 2, 5]), st.sampled_from(["uint16", "uint32"]))
def test_windows_are_the_stream_cut_every_seq_len_tokens(output, documents, seq_len, max_shard_records, dtype):
    """Token p (token values are their positions) lies in window w exactly when w*seq_len <= p <= w*seq_len + seq_len,
    whether the window lies in one shard or crosses shard ends, as tensors or as numpy arrays."""
    stream = np.concatenate(documents) if documents else np.zeros(0, np.int64)
    with tempfile.TemporaryDirectory() as directory:
        write_tokens(f"{directory}/tokens", documents, dtype, max_shard_records)
        dataset = TokenWindowDataset(f"{directory}/tokens", seq_len, document_starts=True, output=output)
        count = len(dataset)
        assert count == max(0, (len(stream) - 1) // seq_len)
        if count:
            assert len(stream) - (count * seq_len + 1) == (len(stream) - 1) % seq_len
        samples = dataset.__getitems__(list(range(count)))
    document_starts = set(np.cumsum([0] + [len(document) for document in documents[:-1]]).tolist())
    for window, sample in enumerate(samples):
        tokens, marks = sample["tokens"], sample["document_starts"]
        if output == "torch":
            assert tokens.dtype == torch.int64
            marks = marks.numpy()
        else:
            assert tokens.dtype == np.dtype(dtype) and marks.dtype == np.bool_
        assert tuple(tokens.shape) == (seq_len + 1,)
        assert tokens.tolist() == list(range(window * seq_len, window * seq_len + seq_len + 1))
        marked = [window * seq_len + column for column in np.flatnonzero(marks).tolist()]
        in_window = [start for start in sorted(document_starts) if window * seq_len <= start <= window * seq_len + seq_len]
        assert marked == in_window


def test_numpy_windows_inside_a_shard_are_zero_copy_views(tmp_path):
    write_tokens(tmp_path / "tokens", [np.arange(0, 7), np.arange(7, 20)], max_shard_records=1)
    dataset = TokenWindowDataset(tmp_path / "tokens", 4, output="numpy")
    inside, crossing = dataset[0], dataset[1]
    assert inside.dtype == np.uint16 and not inside.flags.owndata and not inside.flags.writeable
    assert inside.tolist() == [0, 1, 2, 3, 4]
    assert crossing.tolist() == [4, 5, 6, 7, 8]


def test_window_across_several_shards_and_empty_documents(tmp_path):
    documents = [np.arange(0, 2), np.arange(2, 2), np.arange(2, 3), np.arange(3, 3), np.arange(3, 9)]
    write_tokens(tmp_path / "tokens", documents, max_shard_records=1)
    dataset = TokenWindowDataset(tmp_path / "tokens", 4, document_starts=True)
    assert dataset[0]["tokens"].tolist() == [0, 1, 2, 3, 4]
    assert dataset[0]["document_starts"].tolist() == [True, False, True, True, False]


def test_sampler_shuffles_windows_as_a_permutation_that_changes_per_epoch(tmp_path):
    write_tokens(tmp_path / "tokens", [np.arange(1000)])
    dataset = TokenWindowDataset(tmp_path / "tokens", 7)
    sampler = ExactlyOnceSampler(dataset, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(len(dataset)))
    assert first != second


def test_loader_with_workers_stacks_windows(tmp_path):
    write_tokens(tmp_path / "tokens", [np.arange(500)], dtype="uint32", max_shard_records=1)
    dataset = TokenWindowDataset(tmp_path / "tokens", 16)
    loader = DataLoader(dataset, batch_size=5, sampler=ExactlyOnceSampler(dataset, seed=0), num_workers=2)
    batches = list(loader)
    assert all(batch.shape[1] == 17 and batch.dtype == torch.int64 for batch in batches)
    starts = sorted(int(batch[row, 0]) for batch in batches for row in range(len(batch)))
    assert starts == [window * 16 for window in range(len(dataset))]


@pytest.mark.parametrize(
    ("codec", "options", "message"),
    [
        ("ndarray", {"dtype": "float32"}, "1-D integer ndarray"),
        ("ndarray", {"dtype": "int32", "shape": (2,)}, "trailing shape"),
        ("bytes", {}, "this dataset is bytes"),
    ],
)
def test_datasets_that_are_not_token_streams_are_refused(tmp_path, codec, options, message):
    with varstore.Writer(tmp_path / "data", codec=codec, **options):
        pass
    with pytest.raises(varstore.RecordTypeError, match=message):
        TokenWindowDataset(tmp_path / "data", 8)


def test_bad_window_indices_and_lengths_are_refused(tmp_path):
    write_tokens(tmp_path / "tokens", [np.arange(10)])
    dataset = TokenWindowDataset(tmp_path / "tokens", 3)
    with pytest.raises(varstore.RecordIndexError, match="window 3 is out of range for 3 windows"):
        dataset[3]
    with pytest.raises(varstore.RecordIndexError):
        dataset[-1]
    for bad_length in (0, -1):  # a bad value, not a bad type: no TypeError
        with pytest.raises(varstore.VarstoreError, match=f"seq_len must be at least 1, not {bad_length}") as refused:
            TokenWindowDataset(tmp_path / "tokens", bad_length)
        assert not isinstance(refused.value, TypeError)
    with pytest.raises(varstore.RecordTypeError, match="seq_len must be an integer"):
        TokenWindowDataset(tmp_path / "tokens", 2.5)
    with pytest.raises(varstore.VarstoreError, match="output"):
        TokenWindowDataset(tmp_path / "tokens", 3, output="pandas")


def test_document_start_inside_a_token_is_a_corrupt_record_not_a_mark_one_token_early(tmp_path):
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint16") as writer:
        writer.extend([np.arange(5, dtype=np.uint16), np.arange(5, dtype=np.uint16)])
    with varstore.open(tmp_path / "tokens") as reader:
        second_offset = reader.header.offsets_start + 8
    with open(tmp_path / "tokens.index", "r+b") as index:
        index.seek(second_offset)
        index.write(struct.pack("<Q", 9))  # record 1 would start inside token 4 (bytes 8-9)
    dataset = TokenWindowDataset(tmp_path / "tokens", 8, document_starts=True)
    with pytest.raises(varstore.CorruptRecordError, match="inside a 2-byte token"):
        dataset[0]


def test_uint64_token_ids_int64_cannot_hold_are_refused_naming_the_window_and_kept_exact_with_keep_dtype_or_numpy(tmp_path):
    big = np.array([2**63 + 5, 1, 2, 3, 4], np.uint64)
    with varstore.Writer(tmp_path / "tokens", codec="ndarray", dtype="uint64") as writer:
        writer.append(big)
    assert TokenWindowDataset(tmp_path / "tokens", 2)[1].tolist() == [2, 3, 4]  # int64: these values fit
    with pytest.raises(varstore.RecordTypeError, match="window 0 holds uint64 value 9223372036854775813.*keep_dtype=True"):
        TokenWindowDataset(tmp_path / "tokens", 2)[0]
    window = TokenWindowDataset(tmp_path / "tokens", 2, output="numpy")[0]
    assert window.dtype == np.uint64 and window.tolist() == big[:3].tolist()
    kept = TokenWindowDataset(tmp_path / "tokens", 2, keep_dtype=True)[0]
    assert kept.dtype == torch.uint64 and kept.tolist() == big[:3].tolist()
