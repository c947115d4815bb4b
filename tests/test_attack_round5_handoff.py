"""Round 5 attacks on a `SampleBatch` crossing processes as one shared buffer (varstore/torch/collate.py): a
collate_fn that keeps every sample object, shape, strides and pointer but reinterprets a sample in place (``.data``
set to a view of another dtype, ``__class__`` set to another tensor class) must not have the receiver cut the buffer
into the samples as they were read: what arrives is what was sent, as a plain list of tensors gives."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.torch import RecordDataset

LOADER_SAFETY_NET_S = 300  # a stuck worker fails the test instead of hanging it; never reached by a working loader


class TaggedTensor(torch.Tensor):
    """A tensor class a collate_fn may give its samples."""


def _viewed_as_float64(sample: torch.Tensor) -> None:
    sample.data = sample.data.view(torch.float64)


def _tagged(sample: torch.Tensor) -> None:
    sample.__class__ = TaggedTensor


def _signed_bytes(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """A collate_fn reading ``bytes`` records as int8, in place on each sample (same memory, shape and strides)."""
    for sample in batch:
        sample.data = sample.data.view(torch.int8)
    return batch


def _write(directory: Path, dtype: str) -> Path:
    rng = np.random.default_rng(0)
    records = [(rng.normal(size=(rows, 2)) * 100).astype(dtype) for rows in (3, 1, 4)]
    with varstore.ShardedWriter(directory, "ndarray", dtype=dtype, shape=(2,), overwrite=True) as writer:
        writer.extend(records)
    return directory


@pytest.mark.parametrize(
    ("dtype", "reinterpret"),
    [("int64", _viewed_as_float64), ("float32", _tagged)],
)
def test_a_sample_reinterpreted_in_place_arrives_as_sent(
    tmp_path: Path, dtype: str, reinterpret: Callable[[torch.Tensor], None]
) -> None:
    batch = RecordDataset(_write(tmp_path / "data", dtype)).__getitems__([0, 1, 2])
    reinterpret(batch[1])
    received = ForkingPickler.loads(ForkingPickler.dumps(batch))
    for got, sent in zip(received, batch, strict=True):
        assert type(got) is type(sent) and got.dtype == sent.dtype
        assert torch.equal(got, sent)


@pytest.mark.timeout(900)
def test_fork_workers_hand_over_bytes_samples_a_collate_fn_made_int8(tmp_path: Path) -> None:
    blobs = [bytes(range(200, 256)) * 3, b"", bytes(range(0, 256, 7))]
    with varstore.ShardedWriter(tmp_path / "blobs", "bytes") as writer:
        writer.extend(blobs)
    loader = DataLoader(RecordDataset(tmp_path / "blobs"), batch_size=3, num_workers=2, collate_fn=_signed_bytes,
                        multiprocessing_context="fork", timeout=LOADER_SAFETY_NET_S)
    (batch,) = list(loader)
    assert [sample.dtype for sample in batch] == [torch.int8] * 3
    assert [sample.tolist() for sample in batch] == [np.frombuffer(blob, np.int8).tolist() for blob in blobs]
