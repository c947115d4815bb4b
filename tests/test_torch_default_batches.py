"""The default 0-worker path (issue 26, item 4): `RecordDataset.__getitems__` hands collation a `SampleBatch`, whose
buffer `collate_jagged` / `collate_padded` take instead of joining the samples again; the batches are the ones
the samples read one by one collate to, and a list changed before collation is collated as changed. And the data
map's advice by residency (item 5), read back from the kernel's own flags for the map."""

from __future__ import annotations

import mmap
import pickle
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import varstore
from varstore.local import mapping
from varstore.torch import ExactlyOnceSampler, RecordDataset, collate_jagged, collate_padded
from varstore.torch.collate import SampleBatch

from .helpers_torch import write_indexed_dataset

COUNT = 300


@pytest.fixture
def dataset(tmp_path: Path) -> RecordDataset:
    write_indexed_dataset(tmp_path / "indexed", COUNT)
    return RecordDataset(tmp_path / "indexed")


def assert_same(batch, expected) -> None:
    for name in expected._fields:
        got, want = getattr(batch, name), getattr(expected, name)
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("collate", [collate_jagged, collate_padded])
def test_default_batches_are_what_the_samples_read_one_by_one_collate_to(dataset: RecordDataset, collate) -> None:
    sampler = ExactlyOnceSampler(dataset, seed=5)
    order = list(ExactlyOnceSampler(COUNT, seed=5))
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=0, collate_fn=collate)
    batches = list(loader)
    assert len(batches) == -(-COUNT // 32)
    for number, batch in enumerate(batches):
        one_by_one = [dataset[index] for index in order[number * 32 : (number + 1) * 32]]  # a plain list
        assert_same(batch, collate(one_by_one))
        assert batch.values.dtype == torch.int64


def test_a_batch_changed_before_collation_is_collated_as_changed(dataset: RecordDataset) -> None:
    samples = dataset.__getitems__([3, 4, 5])
    assert isinstance(samples, SampleBatch)
    samples[1] = torch.tensor([7, 7, 7], dtype=torch.int64)
    assert collate_jagged(samples).values.tolist() == [3] * 4 + [7] * 3 + [5]
    more = dataset.__getitems__([3, 4])
    more.append(torch.tensor([9], dtype=torch.int64))
    assert collate_jagged(more).values.tolist() == [3] * 4 + [4] * 5 + [9]


def test_a_sample_batch_crosses_processes_as_a_plain_list(dataset: RecordDataset) -> None:
    samples = dataset.__getitems__([1, 2])
    copied = pickle.loads(pickle.dumps(samples))
    assert type(copied) is list and [sample.tolist() for sample in copied] == [[1, 1], [2, 2, 2]]


def _data_map_flags(path: Path) -> list[str]:
    """The kernel's VmFlags of this process's maps of `path` (smaps), one entry per map."""
    found, current = [], None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line.split()[-1:] == [str(path)] and "-" in line.split()[0]:
                current = True
            elif line.startswith("VmFlags:") and current:
                found.append(line.split()[1:])
                current = None
            elif ":" not in line.split()[0]:
                current = None
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_RANDOM"), reason="needs Linux smaps")
@pytest.mark.parametrize("cached, random_advice", [(True, False), (False, True)])
def test_the_data_map_is_advised_random_only_when_the_file_looks_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool, random_advice: bool
) -> None:
    path = tmp_path / "blobs"
    with varstore.Writer(path, codec="bytes") as writer:
        writer.extend([bytes(5000)] * 10)
    probed = []
    monkeypatch.setattr(mapping, "looks_cached", lambda fd, size: probed.append(size) or cached)
    with varstore.open(path) as reader:
        flags = _data_map_flags(Path(reader.data_path).resolve())
        assert reader[3] == bytes(5000)
    assert len(flags) == 1, flags
    assert ("rr" in flags[0]) is random_advice, flags[0]
    assert 50000 in probed  # the data file's residency was what decided
