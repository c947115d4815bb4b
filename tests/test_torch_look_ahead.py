"""The sampler's look-ahead (issue 26, item 3): `ExactlyOnceSampler` hands its data source's ``will_need`` the
indices it will yield next, and only those, at most two `LOOK_AHEAD_PIECE`s ahead; `Reader.will_need` advises the
pages of exactly those records. The advice runs in a thread, so every assertion here holds whenever it runs: what
was advised is compared with what the iterator had yielded by then, which only grows."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import varstore
from varstore.torch import ExactlyOnceSampler, RecordDataset, collate_jagged
from varstore.torch.sampler import LOOK_AHEAD_PIECE

from .helpers_torch import batch_indices, write_indexed_dataset

BOUND = 2 * LOOK_AHEAD_PIECE


class RecordingSource:
    """A data source of `size` records whose ``will_need`` records each piece and how many indices the consumer
    had taken when the advice ran."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0
        self.calls: list[tuple[list[int], int]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.size

    def will_need(self, indices: np.ndarray) -> None:
        with self._lock:
            self.calls.append((np.asarray(indices).tolist(), self.taken))

    def consume(self, iterator, count: int | None = None) -> list[int]:
        taken = []
        for index in iterator:
            taken.append(index)
            with self._lock:
                self.taken += 1
            if count is not None and len(taken) == count:
                break
        return taken

    def advised(self) -> list[int]:
        return [index for piece, _ in self.calls for index in piece]


def assert_bounded(source: RecordingSource) -> None:
    hinted = 0
    for piece, taken in source.calls:
        hinted += len(piece)
        assert hinted - taken <= BOUND, f"{hinted} indices advised when {taken} were taken: more than {BOUND} ahead"


@pytest.mark.parametrize("rank, world_size", [(0, 1), (1, 3)])
def test_look_ahead_advises_exactly_the_indices_yielded_in_their_order(rank: int, world_size: int) -> None:
    source = RecordingSource(5 * LOOK_AHEAD_PIECE + 37)
    sampler = ExactlyOnceSampler(source, seed=4, rank=rank, world_size=world_size)
    iterator = iter(sampler)
    yielded = source.consume(iterator)  # exhausting it closes the look-ahead, which advises what is pending first
    assert source.advised() == yielded
    assert yielded == list(ExactlyOnceSampler(source.size, seed=4, rank=rank, world_size=world_size))
    assert_bounded(source)


def test_an_abandoned_epoch_was_advised_no_further_than_the_bound() -> None:
    source = RecordingSource(20 * LOOK_AHEAD_PIECE)
    sampler = ExactlyOnceSampler(source, seed=1)
    iterator = iter(sampler)
    taken = source.consume(iterator, count=LOOK_AHEAD_PIECE + 3)
    iterator.close()  # what a DataLoader's end (or garbage collection) does to the sampler's generator
    advised = source.advised()
    assert advised[: len(taken)] == taken
    assert len(taken) < len(advised) <= len(taken) + BOUND
    full = list(ExactlyOnceSampler(len(source), seed=1))
    assert advised == full[: len(advised)], "advised an index the epoch would not yield next"
    assert not any(thread.name == "varstore-look-ahead" for thread in threading.enumerate())


def test_a_resumed_epoch_advises_only_what_remains_of_it() -> None:
    source = RecordingSource(3 * LOOK_AHEAD_PIECE + 11)
    first = ExactlyOnceSampler(source, seed=7)
    iterator = iter(first)
    before = source.consume(iterator, count=LOOK_AHEAD_PIECE + 5)
    state = first.state_dict(len(before))
    iterator.close()
    resumed = RecordingSource(source.size)
    second = ExactlyOnceSampler(resumed, seed=7)
    second.load_state_dict(state)
    after = resumed.consume(iter(second))
    assert resumed.advised() == after
    assert sorted(before + after) == list(range(source.size))


def pages_of(starts: np.ndarray, ends: np.ndarray) -> set[int]:
    page = mmap.PAGESIZE
    return {number for start, end in zip(starts.tolist(), ends.tolist()) if end > start
            for number in range(start // page, (end - 1) // page + 1)}


@pytest.fixture
def advice_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Every posix_fadvise call as (offset, length, advice), the real call still made."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("needs posix_fadvise")
    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise
    lock = threading.Lock()

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        with lock:
            calls.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    return calls


def advised_pages(calls: list[tuple[int, int, int]]) -> list[int]:
    page = mmap.PAGESIZE
    pages = []
    for offset, length, advice in calls:
        assert advice == os.POSIX_FADV_WILLNEED and offset % page == 0 and length % page == 0
        pages.extend(range(offset // page, (offset + length) // page))
    return pages


def test_reader_advises_each_page_of_the_records_once_and_no_other(tmp_path: Path, advice_calls) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 3 * mmap.PAGESIZE, 400)  # records inside one page, across two, spanning several, empty
    path = tmp_path / "blobs"
    with varstore.Writer(path, codec="bytes") as writer:
        writer.extend(bytes(int(length)) for length in lengths)
    offsets = np.concatenate(([0], np.cumsum(lengths)))  # from the lengths written, not from the reader
    chosen = rng.choice(len(lengths), 60, replace=False)
    with varstore.open(path) as reader:
        advice_calls.clear()  # the open's own advice (the index) is not what is under test
        reader.will_need(chosen)
    pages = advised_pages(advice_calls)
    assert len(pages) == len(set(pages)), "a page was advised twice"
    assert set(pages) == pages_of(offsets[chosen], offsets[chosen + 1])


def test_a_reader_gives_no_advice_and_no_error_for_indices_it_does_not_hold(tmp_path: Path, advice_calls) -> None:
    path = tmp_path / "small"
    with varstore.Writer(path, codec="bytes") as writer:
        writer.extend([b"x" * 10] * 5)
    with varstore.open(path) as reader:
        advice_calls.clear()
        reader.will_need([0, 7])
        reader.will_need([-9])
    assert advice_calls == []


def test_a_dataloader_over_a_dataset_advises_the_pages_of_the_records_it_yields(tmp_path: Path, advice_calls) -> None:
    path = tmp_path / "indexed"
    count = 3 * LOOK_AHEAD_PIECE
    write_indexed_dataset(path, count, max_shard_records=LOOK_AHEAD_PIECE)
    dataset = RecordDataset(path)
    reader = dataset.reader
    advice_calls.clear()
    loader = DataLoader(dataset, batch_size=16, sampler=ExactlyOnceSampler(dataset, seed=2), collate_fn=collate_jagged)
    seen = [index for batch in loader for index in batch_indices(batch)]
    assert sorted(seen) == list(range(count))
    expected = set()
    for position in range(len(reader.shard_paths)):
        shard = reader.shard(position)
        offsets = np.asarray(shard._offsets, np.int64)
        expected |= pages_of(offsets[:-1], offsets[1:])  # every record was yielded: every page of every shard
    assert sorted(set(advised_pages(advice_calls))) == sorted(expected)
