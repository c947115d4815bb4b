"""A `SampleBatch` crosses from a DataLoader worker to the main process as one shared buffer and its lengths, and is
cut again there into the samples 0 workers give: same type, dtypes, values and collation, each sample a tensor of its
own storage (changed in place, it changes no other sample and bumps no other's version); a list changed in the worker
crosses as the plain list it is."""

from __future__ import annotations

import tempfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, default_collate
from torch.utils.data._utils.pin_memory import pin_memory

import varstore
from varstore.torch import RecordDataset, collate_jagged, collate_padded
from varstore.torch.collate import SampleBatch

WORKER_TEST_TIMEOUT = 900
LOADER_SAFETY_NET_S = 300  # a stuck worker fails the test instead of hanging it; never reached by a working loader
BATCH = 3


def _as_list(batch: list) -> list:
    return batch


def write_records(directory: Path, codec: str, lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    """Records of `lengths` rows (int32 rows of 2 for ``ndarray``, bytes for ``bytes``) in shards of 4 records."""
    rng = np.random.default_rng(seed)
    if codec == "ndarray":
        records = [rng.integers(-1000, 1000, (length, 2)).astype(np.int32) for length in lengths]
        options = {"dtype": "int32", "shape": (2,)}
    else:
        records = [rng.integers(0, 256, length).astype(np.uint8) for length in lengths]
        options = {}
    with varstore.ShardedWriter(directory, codec, max_shard_records=4, overwrite=True, **options) as writer:
        writer.extend(records if codec == "ndarray" else [record.tobytes() for record in records])
    return records


def batches(dataset: RecordDataset, workers: int, context: str | None = None) -> list:
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, multiprocessing_context=context,
                        timeout=LOADER_SAFETY_NET_S if workers else 0, collate_fn=_as_list)
    return list(loader)


def assert_same_samples(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for batch, wanted in zip(got, expected):
        assert type(batch) is type(wanted) is SampleBatch
        assert len(batch) == len(wanted)
        for sample, want in zip(batch, wanted):
            assert sample.dtype == want.dtype and sample.shape == want.shape and torch.equal(sample, want)
        for collate in (collate_jagged, collate_padded):
            collated, reference = collate(batch), collate(wanted)
            for name in reference._fields:
                assert torch.equal(getattr(collated, name), getattr(reference, name)), (collate, name)


def assert_independent(batch: SampleBatch) -> None:
    """Each sample has a storage of its own, so changing one in place leaves the others' values and versions."""
    for sample in batch:
        assert sample.untyped_storage().nbytes() == sample.numel() * sample.element_size()
    if len(batch) < 2 or batch[0].numel() == 0:
        return
    before = [sample.clone() for sample in batch[1:]]
    versions = [sample._version for sample in batch[1:]]
    batch[0].add_(1)
    assert all(torch.equal(sample, old) for sample, old in zip(batch[1:], before))
    assert [sample._version for sample in batch[1:]] == versions


record_lengths = st.lists(st.integers(0, 40), min_size=1, max_size=12)


@pytest.mark.timeout(WORKER_TEST_TIMEOUT)
@pytest.mark.parametrize("codec", ["ndarray", "bytes"])
@settings(max_examples=12)
@given(lengths=record_lengths)
def test_fork_workers_give_the_samples_0_workers_give(codec: str, lengths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        write_records(Path(directory) / "data", codec, lengths)
        dataset = RecordDataset(Path(directory) / "data")
        got = batches(dataset, 2, "fork")
        assert_same_samples(got, batches(dataset, 0))
        for batch in got:
            assert_independent(batch)


@pytest.mark.timeout(WORKER_TEST_TIMEOUT)
@settings(max_examples=3)  # two spawned workers cost seconds each
@given(lengths=record_lengths)
def test_spawn_workers_give_the_samples_0_workers_give(lengths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        write_records(Path(directory) / "data", "ndarray", lengths)
        dataset = RecordDataset(Path(directory) / "data")
        got = batches(dataset, 2, "spawn")
        assert_same_samples(got, batches(dataset, 0))
        for batch in got:
            assert_independent(batch)


def test_a_batch_crosses_as_one_buffer_cut_into_samples_of_their_own(tmp_path: Path) -> None:
    write_records(tmp_path / "data", "ndarray", [3, 0, 5, 1])
    sent = RecordDataset(tmp_path / "data").__getitems__([0, 1, 2, 3])
    received = ForkingPickler.loads(ForkingPickler.dumps(sent))
    assert type(received) is SampleBatch and received[0].data_ptr() != sent[0].data_ptr()
    start, row = received[0].data_ptr(), 2 * 8  # int64 rows of 2, back to back in one buffer
    assert received[2].data_ptr() == start + 3 * row and received[3].data_ptr() == start + 8 * row
    assert [sample.tolist() for sample in received] == [sample.tolist() for sample in sent]
    assert_independent(received)


def test_a_batch_changed_in_the_worker_crosses_as_the_list_it_is(tmp_path: Path) -> None:
    write_records(tmp_path / "data", "ndarray", [3, 2, 4])
    dataset = RecordDataset(tmp_path / "data")
    reshaped = dataset.__getitems__([0, 1, 2])
    reshaped[1].unsqueeze_(0)
    transposed = dataset.__getitems__([0, 1, 2])
    transposed[0].t_()
    moved = dataset.__getitems__([0, 1, 2])
    moved[2].share_memory_()  # now a copy in shared memory: changing it no longer changes the buffer
    moved[2].add_(1)
    replaced = dataset.__getitems__([0, 1, 2])
    replaced[2] = torch.arange(4)
    for changed in (reshaped, transposed, moved, replaced):
        received = ForkingPickler.loads(ForkingPickler.dumps(changed))
        assert type(received) is list
        assert [sample.shape for sample in received] == [sample.shape for sample in changed]
        assert all(torch.equal(got, sample) for got, sample in zip(received, changed))


def test_collation_in_the_workers_gives_what_it_gives_without_them(tmp_path: Path) -> None:
    write_records(tmp_path / "ragged", "ndarray", [3, 0, 5, 1, 7, 2, 2])
    write_records(tmp_path / "even", "bytes", [4] * 7)
    cases = [("ragged", collate_jagged), ("ragged", collate_padded), ("even", default_collate)]
    for name, collate in cases:
        dataset = RecordDataset(tmp_path / name)
        loaders = [DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate,
                              multiprocessing_context="fork" if workers else None,
                              timeout=LOADER_SAFETY_NET_S if workers else 0) for workers in (0, 2)]
        for alone, handed in zip(*loaders, strict=True):
            for want, got in zip(alone, handed, strict=True):
                assert want.dtype == got.dtype and torch.equal(want, got)


def test_a_received_batch_pins_as_the_list_of_its_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_records(tmp_path / "data", "bytes", [3, 0, 5])
    received = ForkingPickler.loads(ForkingPickler.dumps(RecordDataset(tmp_path / "data").__getitems__([0, 1, 2])))
    monkeypatch.setattr(torch.Tensor, "pin_memory", torch.Tensor.clone)  # no accelerator here: pinning is a copy
    pinned = pin_memory(received)
    assert type(pinned) is list and all(torch.equal(got, sample) for got, sample in zip(pinned, received))
