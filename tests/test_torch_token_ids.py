"""Token ids reach a model without a cast: integer records come out as int64 (``keep_dtype=True`` keeps the stored
dtype) from every dataset, collation and DataLoader path, so ``nn.Embedding`` takes them; floats and bools keep theirs."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import (
    ExactlyOnceSampler,
    JaggedBatch,
    PaddedBatch,
    RecordDataset,
    RecordStream,
    TokenWindowDataset,
    collate_jagged,
    collate_padded,
)

VOCABULARY = 65536
LOADER_TIMEOUT = 60


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """60 uint16 documents of 5..200 tokens over the whole vocabulary (65535 included), 20 per shard."""
    path = tmp_path_factory.mktemp("token-ids") / "tokens"
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, 60)
    stream = rng.integers(0, VOCABULARY, int(lengths.sum())).astype(np.uint16)
    stream[3] = VOCABULARY - 1
    with varstore.ShardedWriter(path, codec="ndarray", dtype="uint16", max_shard_records=20) as writer:
        writer.extend_flat(stream, lengths)
    return path


@pytest.fixture(scope="module")
def embedding():
    return torch.nn.Embedding(VOCABULARY, 8)


def test_record_dataset_items_and_batches_feed_an_embedding(tokens, embedding):
    dataset = RecordDataset(tokens)
    sample = dataset[0]
    assert sample.dtype == torch.int64 and int(sample.max()) == VOCABULARY - 1
    assert embedding(sample).shape == (len(sample), 8)
    for sample in dataset.__getitems__([5, 25, 45]):
        assert embedding(sample).shape == (len(sample), 8)


def test_padded_batches_feed_an_embedding_from_numpy_or_tensor_samples(tokens, embedding):
    for output in ("numpy", "torch"):
        batch = collate_padded(RecordDataset(tokens, output=output).__getitems__([0, 21, 59]))
        assert batch.values.dtype == torch.int64
        assert embedding(batch.values).shape == (*batch.values.shape, 8)


def test_jagged_and_flat_batches_feed_an_embedding(tokens, embedding):
    numpy_samples = RecordDataset(tokens, output="numpy").__getitems__([0, 21, 59])
    flat_numpy = RecordDataset(tokens, output="numpy", flat_batches=True).__getitems__([0, 21, 59])
    flat_torch = RecordDataset(tokens, flat_batches=True).__getitems__([0, 21, 59])
    assert isinstance(flat_torch, JaggedBatch)
    batches = [collate_jagged(numpy_samples), collate_jagged(flat_numpy), collate_jagged(flat_torch), flat_torch]
    for batch in batches:
        assert batch.values.dtype == torch.int64
        assert embedding(batch.values).shape == (len(batch.values), 8)
        assert torch.equal(batch.values, batches[0].values)
    padded = collate_padded(flat_numpy)
    assert padded.values.dtype == torch.int64 and embedding(padded.values).shape == (*padded.values.shape, 8)


def test_token_windows_feed_an_embedding(tokens, embedding):
    window = TokenWindowDataset(tokens, seq_len=64)[3]
    assert window.dtype == torch.int64 and embedding(window).shape == (65, 8)
    sample = TokenWindowDataset(tokens, seq_len=64, document_starts=True)[3]
    assert sample["tokens"].dtype == torch.int64 and sample["document_starts"].dtype == torch.bool
    assert embedding(sample["tokens"]).shape == (65, 8)


def _windows_loader(path, context: str) -> DataLoader:
    dataset = TokenWindowDataset(path, seq_len=64)
    return DataLoader(dataset, batch_size=8, sampler=ExactlyOnceSampler(dataset, seed=0, rank=0, world_size=1),
                      num_workers=2, multiprocessing_context=context, timeout=LOADER_TIMEOUT)


def _padded_records_loader(path, context: str) -> DataLoader:
    return DataLoader(RecordDataset(path, output="numpy"), batch_size=8, shuffle=True, num_workers=2,
                      multiprocessing_context=context, timeout=LOADER_TIMEOUT,
                      collate_fn=functools.partial(collate_padded, pad_value=0, pad_to_multiple=8))


@pytest.mark.parametrize("make_loader", [_windows_loader, _padded_records_loader])
def test_dataloader_batches_from_workers_feed_an_embedding(tokens, embedding, make_loader):
    for batch in make_loader(tokens, "fork"):
        values = batch.values if isinstance(batch, PaddedBatch) else batch
        assert values.dtype == torch.int64
        assert embedding(values).shape == (*values.shape, 8)


def test_the_dtype_choice_travels_to_spawn_workers_with_the_pickled_dataset(tokens):
    """What a spawn worker receives, without paying for one (a spawn DataLoader takes ~10 s here)."""
    for keep_dtype, dtype in ((False, torch.int64), (True, torch.uint16)):
        windows = pickle.loads(pickle.dumps(TokenWindowDataset(tokens, seq_len=64, keep_dtype=keep_dtype)))
        records = pickle.loads(pickle.dumps(RecordDataset(tokens, keep_dtype=keep_dtype)))
        assert windows[0].dtype == dtype and records[0].dtype == dtype


def test_record_stream_batches_feed_an_embedding(tokens, embedding):
    stream = RecordStream(tokens, batch_size=16, block_size=4, collate_fn=collate_jagged, output="numpy")
    for batch in stream:
        assert batch.values.dtype == torch.int64 and embedding(batch.values).shape == (len(batch.values), 8)


def test_keep_dtype_keeps_the_stored_uint16_on_every_path(tokens):
    kept = torch.uint16
    assert RecordDataset(tokens, keep_dtype=True)[0].dtype == kept
    assert RecordDataset(tokens, keep_dtype=True, flat_batches=True).__getitems__([0, 1]).values.dtype == kept
    numpy_samples = RecordDataset(tokens, output="numpy").__getitems__([0, 1])
    assert collate_padded(numpy_samples, keep_dtype=True).values.dtype == kept
    assert collate_jagged(numpy_samples, keep_dtype=True).values.dtype == kept
    assert TokenWindowDataset(tokens, seq_len=64, keep_dtype=True)[0].dtype == kept
    stream = RecordStream(tokens, batch_size=4, keep_dtype=True, collate_fn=collate_jagged)
    assert next(iter(stream)).values.dtype == kept
    assert RecordDataset(tokens, output="numpy")[0].dtype == np.uint16


def test_keep_dtype_with_numpy_output_points_to_the_collate_function(tokens):
    for make in (lambda: RecordDataset(tokens, output="numpy", keep_dtype=True),
                 lambda: TokenWindowDataset(tokens, seq_len=8, output="numpy", keep_dtype=True)):
        with pytest.raises(varstore.VarstoreError, match="pass keep_dtype=True to the collate function"):
            make()


def test_uint64_records_with_values_int64_cannot_hold_are_refused_naming_the_record_unless_keep_dtype(tmp_path):
    big = np.array([2**63 + 5, 1], np.uint64)
    with varstore.Writer(tmp_path / "ids", codec="ndarray", dtype="uint64") as writer:
        writer.append(np.array([7], np.uint64))
        writer.append(big)
    expected = "record 1 holds uint64 value 9223372036854775813.*keep_dtype=True"
    with pytest.raises(varstore.RecordTypeError, match=expected) as refused:
        RecordDataset(tmp_path / "ids")[-1]
    assert str(tmp_path / "ids") in str(refused.value)
    assert RecordDataset(tmp_path / "ids")[0].dtype == torch.int64
    sample = RecordDataset(tmp_path / "ids", keep_dtype=True)[1]
    assert sample.dtype == torch.uint64 and sample.tolist() == big.tolist()
    with pytest.raises(varstore.RecordTypeError, match="sample 1 holds.*keep_dtype=True"):
        collate_jagged(RecordDataset(tmp_path / "ids", output="numpy").__getitems__([0, 1]))


@pytest.mark.parametrize(
    ("dtype", "tensor_dtype"), [("float16", torch.float16), ("float32", torch.float32), ("bool", torch.bool)]
)
def test_floats_and_bools_keep_their_dtype(tmp_path, dtype, tensor_dtype):
    with varstore.Writer(tmp_path / "values", codec="ndarray", dtype=dtype) as writer:
        writer.extend([np.ones(3, dtype), np.zeros(5, dtype)])
    assert RecordDataset(tmp_path / "values")[0].dtype == tensor_dtype
    samples = RecordDataset(tmp_path / "values", output="numpy").__getitems__([0, 1])
    assert collate_padded(samples).values.dtype == tensor_dtype
    assert collate_jagged(samples).values.dtype == tensor_dtype


def test_bytes_records_stay_uint8_tensors(tmp_path):
    with varstore.Writer(tmp_path / "blobs") as writer:
        writer.extend([b"\x00\xff", b"\x07"])
    assert RecordDataset(tmp_path / "blobs")[0].dtype == torch.uint8


def test_minus_100_pads_uint16_tokens_as_int64_labels_a_loss_takes():
    stored = [np.array([1, 2, 3], np.uint16), np.array([3], np.uint16)]  # read-only views, as output="numpy" gives
    for array in stored:
        array.flags.writeable = False
    batch = collate_padded(stored, pad_value=-100)
    assert batch.values.dtype == torch.int64 and batch.values.tolist() == [[1, 2, 3], [3, -100, -100]]
    loss = torch.nn.functional.cross_entropy(torch.zeros(2, 4, 3), batch.values)  # ignore_index is -100
    assert torch.isclose(loss, torch.log(torch.tensor(4.0)))


def test_integer_arrays_inside_msgpack_records_become_int64_and_other_fields_keep_their_type(tmp_path, embedding):
    with varstore.Writer(tmp_path / "records", codec="msgpack") as writer:
        for length in (3, 6):
            writer.append({"tokens": np.arange(VOCABULARY - length, VOCABULARY, dtype=np.uint16), "label": length,
                           "weights": np.ones(length, np.float32), "raw": b"\x01\x02", "nested": [np.zeros(2, np.int8)]})
    sample = RecordDataset(tmp_path / "records")[0]
    dtypes = (sample["tokens"].dtype, sample["weights"].dtype, sample["nested"][0].dtype)
    assert dtypes == (torch.int64, torch.float32, torch.int64)
    assert (sample["label"], sample["raw"]) == (3, b"\x01\x02")
    assert embedding(sample["tokens"]).shape == (3, 8)
    kept = RecordDataset(tmp_path / "records", keep_dtype=True)[0]
    assert (kept["tokens"].dtype, kept["nested"][0].dtype) == (torch.uint16, torch.int8)
    padded = collate_padded(RecordDataset(tmp_path / "records", output="numpy").__getitems__([0, 1]))
    assert padded["tokens"].values.dtype == torch.int64 and padded["label"].dtype == torch.int64
    assert padded["weights"].values.dtype == torch.float32
    assert embedding(padded["tokens"].values).shape == (2, 6, 8)
