"""Behaviour the mutation probe's round-3 sample found unpinned (issue 23), outside `RemoteShard`: each test is
named after what it proves, and together they kill the survivors listed in docs/development.md (round 3)."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

import varstore
from tests.test_blind_spots_journal import SyncLog
from varstore.conversion.megatron import read_megatron_index
from varstore.errors import FormatError, StorageError, VarstoreError
from varstore.format.checksum import crc32c
from varstore.remote import filesystems
from varstore.remote.cache import NodeCache
from varstore.remote.filesystems import open_filesystem
from varstore.remote.read_plan import DEFAULT_MAX_GAP, ObjectRanges, cut_pieces, plan_reads
from varstore.torch import BlendedDataset, ExactlyOnceSampler
from varstore.torch.loader_state import dataset_states

# -- read_plan --------------------------------------------------------------------------------------------------


def test_a_long_span_is_cut_into_requests_of_8_mib_by_default() -> None:
    mib = 1 << 20
    plan = plan_reads([ObjectRanges("s3://b/o", 20 * mib, [(0, 20 * mib)])])
    assert [(request.start, request.end) for request in plan.requests] == [(0, 8 * mib), (8 * mib, 16 * mib), (16 * mib, 20 * mib)]


def test_a_range_ending_inside_the_last_of_the_requests_it_spans_gets_only_its_own_bytes() -> None:
    """Ranges [0, 25) and [26, 40) are one run (a 1-byte hole), cut into requests of 10 bytes: the first range ends
    in the middle of the third request, whose remaining bytes belong to the hole and the second range."""
    content = bytes(range(100))
    plan = plan_reads([ObjectRanges("u", len(content), [(0, 25), (26, 40)])], request_bytes=10)
    assert [(request.start, request.end) for request in plan.requests] == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert cut_pieces(plan, [content[r.start : r.end] for r in plan.requests]) == [[content[0:25], content[26:40]]]


@pytest.mark.parametrize("options", [{"request_bytes": 0}, {"request_bytes": -8}, {"max_gap": -1}])
def test_a_request_size_below_one_or_a_negative_gap_is_refused_naming_both(options: dict[str, int]) -> None:
    request_bytes, max_gap = options.get("request_bytes", 8 << 20), options.get("max_gap", DEFAULT_MAX_GAP)
    with pytest.raises(ValueError, match=f"request_bytes must be positive and max_gap not negative, not {request_bytes} and {max_gap}"):
        plan_reads([ObjectRanges("u", 100, [(0, 10), (10, 20)])], **options)


# -- cache ----------------------------------------------------------------------------------------------------


def test_a_cached_object_whose_use_cannot_be_recorded_is_a_storage_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Marking an object used sets its mtime (the eviction order); a cache folder that refuses that (read-only,
    say) is said, not taken for a use recorded."""
    cache, body = NodeCache(str(tmp_path / "cache")), b"an object"
    cache.fetch("bucket/object", len(body), crc32c(body), lambda temporary: Path(temporary).write_bytes(body))

    def read_only(path: str, *args: object, **options: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(os, "utime", read_only)
    with pytest.raises(StorageError, match="marking a cached object used"):
        cache.cached("bucket/object", len(body), crc32c(body))


def test_a_download_is_on_disk_before_the_cache_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cached` trusts a named file of the right size without reading it: after a power loss, a name given before
    the bytes reached the disk would serve a file of zeros as the object."""
    cache, body = NodeCache(str(tmp_path / "cache")), b"an object of some bytes"
    log = SyncLog(monkeypatch)
    path = cache.fetch("bucket/object", len(body), crc32c(body), lambda temporary: Path(temporary).write_bytes(body))
    named = log.events.index(("replace", os.path.basename(path)))
    assert ("fsync", "file", os.stat(path).st_ino, len(body)) in log.events[:named]


# -- transport ------------------------------------------------------------------------------------------------


def test_obstore_forced_where_it_cannot_read_is_refused_naming_the_url_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with varstore.ShardedWriter(tmp_path / "local", "str") as writer:
        writer.extend(["a", "b"])
    fs, _ = open_filesystem("memory://forced-obstore")
    fs.put(str(tmp_path / "local"), f"/forced-obstore/{tmp_path.name}", recursive=True)
    monkeypatch.setenv("VARSTORE_TRANSPORT", "obstore")
    with pytest.raises(VarstoreError, match=r"VARSTORE_TRANSPORT=obstore, but obstore cannot read here: obstore serves "
                                            r"s3:// here, not memory://") as refused:
        list(varstore.open(f"memory://forced-obstore/{tmp_path.name}"))
    assert f"forced-obstore/{tmp_path.name}" in str(refused.value)


def test_a_request_whose_caller_is_cancelled_is_cancelled_too() -> None:
    """A batch cancelled (a sibling request failed, an interrupt) must not leave its requests running, each
    holding a connection of the pool, until they end on their own."""
    async def scenario() -> bool:
        started, finished, cancelled = asyncio.Event(), asyncio.Event(), []

        async def request() -> None:
            started.set()
            try:
                await asyncio.Event().wait()  # an answer that never comes
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            finally:
                finished.set()

        caller = asyncio.ensure_future(filesystems._within(request(), 3600))
        await started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.wait_for(finished.wait(), timeout=60)  # a safety net: the request ends at its next step
        return bool(cancelled)

    assert asyncio.run(scenario())


# -- loader_state ---------------------------------------------------------------------------------------------


def test_a_loader_snapshot_without_a_steps_since_snapshot_count_is_one_taken_at_its_snapshot() -> None:
    state = {"_snapshot": {"_worker_snapshots": {"worker_1": {"dataset_state": "b"}, "worker_0": {"dataset_state": "a"}}}}
    assert dataset_states(state) == ["a", "b"]


# -- megatron: the figures in a refused .idx's message ---------------------------------------------------------


def megatron_idx(path: Path, lengths: list[int], document_indices: list[int], *, documents: int | None = None) -> str:
    """A uint16 Megatron .idx of sequences of `lengths` tokens back to back (layout of megatron-core's
    indexed_dataset.py), its header's document count `documents` (default: as many as `document_indices`)."""
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1] * 2]).astype("<i8")
    count = len(document_indices) if documents is None else documents
    path.write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), count)
                     + np.array(lengths, "<i4").tobytes() + pointers.tobytes() + np.array(document_indices, "<i8").tobytes())
    return str(path)


def test_a_document_count_past_the_file_names_how_many_document_indices_the_file_holds(tmp_path: Path) -> None:
    idx = megatron_idx(tmp_path / "corpus.idx", [3, 4], [0, 1, 2], documents=4)  # room for exactly 3
    with pytest.raises(FormatError, match=r"document count is 4, but after the lengths and pointers of 2 sequences "
                                          r"the \d+-byte file holds at most 3 document indices"):
        read_megatron_index(idx, 14)


def test_falling_document_indices_name_the_first_fall_and_the_value_before_it(tmp_path: Path) -> None:
    idx = megatron_idx(tmp_path / "corpus.idx", [1, 1, 1], [0, 2, 1, 3])
    with pytest.raises(FormatError, match=r"document_indices\[2\] is 1, below document_indices\[1\] = 2$"):
        read_megatron_index(idx, 6)


# -- sampler ---------------------------------------------------------------------------------------------------


def test_a_sampler_state_saved_right_after_a_resume_is_the_state_it_resumed_from() -> None:
    """A checkpoint taken before the resumed sampler yields anything (a run stopped again at once) resumes at the
    same sample; the resumed sampler then yields the rest of the epoch."""
    first = ExactlyOnceSampler(100, seed=3, rank=0, world_size=1)
    epoch = list(ExactlyOnceSampler(100, seed=3, rank=0, world_size=1))
    assert list(islice(iter(first), 10)) == epoch[:10]
    state = first.state_dict()
    resumed = ExactlyOnceSampler(100, seed=3, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert list(resumed) == epoch[10:]


def test_a_sampler_state_saved_before_any_index_of_its_epoch_resumes_that_epoch_from_its_start() -> None:
    """A fresh sampler, and one moved to a new epoch after yielding from the last, count nothing consumed."""
    sampler = ExactlyOnceSampler(50, seed=4, rank=0, world_size=1)
    assert sampler.state_dict()["samples_consumed"] == 0
    assert len(list(islice(iter(sampler), 7))) == 7
    sampler.set_epoch(1)
    state = sampler.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (1, 0)
    resumed = ExactlyOnceSampler(50, seed=4, rank=0, world_size=1)
    resumed.load_state_dict(state)
    second_epoch = ExactlyOnceSampler(50, seed=4, rank=0, world_size=1)
    second_epoch.set_epoch(1)
    assert list(resumed) == list(second_epoch)


def test_a_block_shuffle_window_defaults_to_one_block_and_a_given_one_is_kept() -> None:
    default = ExactlyOnceSampler(100, block_size=10, rank=0, world_size=1)
    given = ExactlyOnceSampler(100, block_size=10, shuffle_window=30, rank=0, world_size=1)
    assert default.state_dict()["shuffle_window"] == 10
    assert given.state_dict()["shuffle_window"] == 30
    assert sorted(default) == sorted(given) == list(range(100))


# -- blended ---------------------------------------------------------------------------------------------------


def test_a_data_path_naming_one_source_twice_is_refused_not_blended_with_the_last_weight(tmp_path: Path) -> None:
    """"0.3 WEB 0.7 WEB" has no one meaning; keeping the last weight would make a blend of WEB alone, silently."""
    with varstore.ShardedWriter(tmp_path / "web", "str") as writer:
        writer.extend(["a", "b", "c"])
    web = str(tmp_path / "web")
    with pytest.raises(VarstoreError, match=f"the data path names {web!r} twice; give it one weight"):
        BlendedDataset.from_data_path(f"0.3 {web} 0.7 {web}", num_samples=10)


@pytest.mark.parametrize("position", [-1, 3, True, 1.0])
def test_a_shard_position_outside_the_manifest_is_refused_not_wrapped(tmp_path: Path, position: object) -> None:
    with varstore.ShardedWriter(tmp_path / "ds", "bytes", max_shard_records=2) as writer:
        writer.extend([b"a", b"b", b"c", b"d", b"e", b"f"])
    with varstore.open(tmp_path / "ds") as dataset:
        assert len(dataset.manifest.shards) == 3
        with pytest.raises(varstore.errors.RecordIndexError, match="out of range for 3 shards"):
            dataset.shard(position)  # type: ignore[arg-type]
        assert dataset.shard(2)[0] == b"e"
