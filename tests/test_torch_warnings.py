"""The documented varstore.torch paths emit no warning, in the main process or in DataLoader workers.

torch warns "The given NumPy array is not writable" when handed a read-only numpy
view (a memory map) without a copy: a tensor that would crash the process if
written. Each test here turns every warning into an error, and makes torch repeat
its once-per-process warnings, so any such hand-over fails the test wherever it
happens; fork workers inherit both settings, and a warning in a worker reaches the
main process as the worker's exception.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import (
    ExactlyOnceSampler,
    RecordDataset,
    RecordStream,
    TokenWindowDataset,
    collate_jagged,
    collate_padded,
)

LOADER_TIMEOUT = 60


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    repeating = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            yield
    finally:
        torch.set_warn_always(repeating)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """uint16 token documents in 3 shards, and msgpack records with token arrays, nested arrays, bytes and labels."""
    root = tmp_path_factory.mktemp("torch-warnings")
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 120, 60)
    with varstore.ShardedWriter(root / "tokens", codec="ndarray", dtype="uint16", max_shard_records=20) as writer:
        writer.extend_flat(rng.integers(0, 65536, int(lengths.sum())).astype(np.uint16), lengths)
    with varstore.Writer(root / "records", codec="msgpack") as writer:
        for length in range(1, 9):
            writer.append({"tokens": np.arange(length, dtype=np.uint16), "label": length, "raw": b"\x00",
                           "scores": np.ones(length, np.float32), "nested": [np.zeros(2, np.int8)]})
    return root


def _every_read(dataset: RecordDataset, indices: list[int]) -> list:
    return [dataset[indices[0]], dataset.__getitems__(indices)]


@pytest.mark.parametrize("name", ["tokens", "records"])
@pytest.mark.parametrize("keep_dtype", [False, True])
def test_record_dataset_samples_and_flat_batches_emit_no_warning(data, name, keep_dtype):
    _every_read(RecordDataset(data / name, keep_dtype=keep_dtype), [0, 3, 7])
    _every_read(RecordDataset(data / name, output="numpy"), [0, 3, 7])
    if name == "tokens":
        RecordDataset(data / name, flat_batches=True, keep_dtype=keep_dtype).__getitems__([0, 30, 59])


@pytest.mark.parametrize("keep_dtype", [False, True])
@pytest.mark.parametrize("name", ["tokens", "records"])
def test_collating_read_only_views_emits_no_warning(data, name, keep_dtype):
    samples = RecordDataset(data / name, output="numpy").__getitems__([0, 3, 7])
    collate_padded(samples, pad_value=0, pad_to_multiple=8, keep_dtype=keep_dtype)
    collate_jagged(samples, keep_dtype=keep_dtype)
    collate_padded(RecordDataset(data / name).__getitems__([0, 3, 7]))
    if name == "tokens":
        for indices in ([0, 1, 2], [0, 30, 59]):  # contiguous records may come back as one view of the map
            flat = RecordDataset(data / name, output="numpy", flat_batches=True).__getitems__(indices)
            collate_jagged(flat, keep_dtype=keep_dtype)
            collate_padded(flat, keep_dtype=keep_dtype)


@pytest.mark.parametrize("keep_dtype", [False, True])
def test_token_windows_emit_no_warning(data, keep_dtype):
    windows = TokenWindowDataset(data / "tokens", seq_len=64, document_starts=True, keep_dtype=keep_dtype)
    windows[0]
    windows.__getitems__(list(range(len(windows))))  # some windows cross shard ends
    TokenWindowDataset(data / "tokens", seq_len=64, output="numpy").__getitems__(list(range(len(windows))))


def test_record_stream_emits_no_warning(data):
    for output in ("torch", "numpy"):
        list(RecordStream(data / "tokens", batch_size=8, block_size=4, collate_fn=collate_jagged, output=output))
    list(RecordStream(data / "records", batch_size=4, collate_fn=collate_padded, output="numpy"))


WORKERS = {"num_workers": 2, "multiprocessing_context": "fork", "timeout": LOADER_TIMEOUT}


def _map_style_loader(path) -> DataLoader:
    return DataLoader(RecordDataset(path / "tokens", output="numpy"), batch_size=8, shuffle=True, **WORKERS,
                      collate_fn=functools.partial(collate_padded, pad_value=-1, pad_to_multiple=8))


def _windows_loader(path) -> DataLoader:
    dataset = TokenWindowDataset(path / "tokens", seq_len=64, document_starts=True)
    return DataLoader(dataset, batch_size=8, sampler=ExactlyOnceSampler(dataset, seed=0, rank=0, world_size=1), **WORKERS)


def _stream_loader(path) -> DataLoader:
    stream = RecordStream(path / "tokens", batch_size=8, block_size=4, collate_fn=collate_jagged, output="numpy")
    return DataLoader(stream, batch_size=None, **WORKERS)


@pytest.mark.parametrize("make_loader", [_map_style_loader, _windows_loader, _stream_loader])
def test_dataloader_workers_emit_no_warning(data, make_loader):
    loader = make_loader(data)
    assert len(list(loader)) == len(loader)


def test_a_warning_in_a_worker_fails_these_checks(data):
    """The control: numpy windows handed to torch's default_collate as they are (not a documented path) are caught."""
    loader = DataLoader(TokenWindowDataset(data / "tokens", seq_len=64, output="numpy"), batch_size=8, **WORKERS)
    with pytest.raises(UserWarning, match="not writable"):
        list(loader)
