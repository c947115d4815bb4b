"""Per-batch read planning (`varstore.remote.read_plan`): a batch's ranges over many objects become few requests
of a bounded size that cover every range exactly, read nothing but the ranges and the small holes between them,
and hand each range back in the caller's order; a remote `ShardedReader` batch makes exactly the planned
requests, counted at moto behind the fault proxy, all shards' in one plan."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from varstore.errors import VarstoreError
from varstore.remote import transport as transport_module
from varstore.remote.filesystems import open_filesystem
from varstore.remote.read_plan import ObjectRanges, cut_pieces, plan_reads


@st.composite
def batches(draw: Any) -> tuple[list[bytes], list[ObjectRanges]]:
    """Up to 4 objects of random bytes, each with up to 12 ranges (empty, overlapping and repeated ones too)."""
    contents = [draw(st.binary(min_size=0, max_size=600)) for _ in range(draw(st.integers(1, 4)))]
    objects = []
    for number, content in enumerate(contents):
        bounds = st.integers(0, len(content))
        pairs = draw(st.lists(st.tuples(bounds, bounds), max_size=12))
        objects.append(ObjectRanges(f"s3://bucket/object-{number}", len(content), [(min(pair), max(pair)) for pair in pairs]))
    return contents, objects


def requested_bytes(wanted: list[tuple[int, int]], max_gap: int) -> set[int]:
    """The offsets a plan should read of one object, computed byte by byte: every wanted byte, and every byte of a
    hole of at most `max_gap` bytes between two wanted ones."""
    marked = sorted({offset for start, end in wanted for offset in range(start, end)})
    read = set(marked)
    for before, after in itertools.pairwise(marked):
        if after - before - 1 <= max_gap:
            read.update(range(before + 1, after))
    return read


@given(batches(), st.integers(0, 40), st.integers(1, 200))
def test_a_plan_covers_every_range_exactly_and_reads_only_ranges_and_small_holes(
    batch: tuple[list[bytes], list[ObjectRanges]], max_gap: int, request_bytes: int
) -> None:
    contents, objects = batch
    plan = plan_reads(objects, max_gap=max_gap, request_bytes=request_bytes)
    by_name = {wanted.name: content for wanted, content in zip(objects, contents)}
    bodies = [by_name[request.name][request.start : request.end] for request in plan.requests]
    assert cut_pieces(plan, bodies) == [[content[start:end] for start, end in wanted.ranges] for wanted, content in zip(objects, contents)]
    for wanted in objects:
        own = [request for request in plan.requests if request.name == wanted.name]
        read = [offset for request in own for offset in range(request.start, request.end)]
        assert len(read) == len(set(read))  # no byte requested twice
        assert set(read) == requested_bytes(list(wanted.ranges), max_gap)
        assert all(request.size == wanted.size for request in own)


@given(batches(), st.integers(0, 40), st.integers(1, 200))
def test_no_request_exceeds_the_cut_size_and_no_two_could_have_been_one(
    batch: tuple[list[bytes], list[ObjectRanges]], max_gap: int, request_bytes: int
) -> None:
    """Every request carries at most `request_bytes` (a range longer than that spans several full requests), and two
    consecutive requests of one object are either a full request and its continuation or more than `max_gap` apart."""
    _, objects = batch
    plan = plan_reads(objects, max_gap=max_gap, request_bytes=request_bytes)
    assert [request.name for request in plan.requests] == sorted(
        (request.name for request in plan.requests), key=[wanted.name for wanted in objects].index
    )
    for request in plan.requests:
        assert 0 < request.end - request.start <= request_bytes
    for first, second in itertools.pairwise(plan.requests):
        if first.name == second.name:
            continued = second.start == first.end and first.end - first.start == request_bytes
            assert continued or second.start - first.end > max_gap


@pytest.mark.parametrize("hole, requests", [(99, 1), (100, 1), (101, 2)])
def test_a_hole_of_at_most_max_gap_bytes_is_read_through(hole: int, requests: int) -> None:
    plan = plan_reads([ObjectRanges("u", 1000, [(0, 10), (10 + hole, 20 + hole)])], max_gap=100)
    assert len(plan.requests) == requests


def test_a_record_larger_than_the_cut_size_comes_back_whole_from_consecutive_requests() -> None:
    content = bytes(range(256)) * 4
    plan = plan_reads([ObjectRanges("u", len(content), [(10, 1000), (3, 5)])], max_gap=0, request_bytes=300)
    assert [(request.start, request.end) for request in plan.requests] == [(3, 5), (10, 310), (310, 610), (610, 910), (910, 1000)]
    assert cut_pieces(plan, [content[r.start : r.end] for r in plan.requests]) == [[content[10:1000], content[3:5]]]


@pytest.mark.parametrize("bad", [(-1, 4), (5, 4), (0, 11), (0.0, 4), (True, 4), ("0", 4)])
def test_a_range_outside_its_object_or_not_integers_is_refused_naming_the_object(bad: tuple[Any, Any]) -> None:
    with pytest.raises(VarstoreError, match="s3://b/second"):
        plan_reads([ObjectRanges("s3://b/first", 10, [(0, 10)]), ObjectRanges("s3://b/second", 10, [(0, 1), bad])])


def test_numpy_offsets_are_offsets() -> None:
    plan = plan_reads([ObjectRanges("u", 10, [(np.int64(2), np.uint32(4))])])
    assert [(request.start, request.end) for request in plan.requests] == [(2, 4)]


# -- a remote batch at the server ---------------------------------------------------------------------------

pytest.importorskip("s3fs")


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def proxied_dataset(s3_server: Any, tmp_path: Path, fault_proxy: Callable[[str], FaultProxy]) -> dict[str, Any]:
    """A 4-shard dataset of records of 2-30 KB in moto, behind a fault proxy, read by ranges only (a node cache
    too small for a whole shard); its shards already open, so a batch's requests are its records' alone."""
    rng = np.random.default_rng(3)
    records = [bytes([n % 251]) * int(size) for n, size in enumerate(rng.integers(2000, 30000, size=160))]
    local_dir = tmp_path / "local"
    with varstore.ShardedWriter(local_dir, "bytes", max_shard_records=40) as writer:
        writer.extend(records)
    bucket = s3_server.new_bucket()
    fs, path = open_filesystem(f"s3://{bucket}/ds", s3_server.storage_options)
    for name in sorted(os.listdir(local_dir)):
        fs.put_file(str(local_dir / name), f"{path}/{name}")
    proxy = fault_proxy(s3_server.endpoint_url)
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    reader = varstore.ShardedReader(f"s3://{bucket}/ds", storage_options=options, cache_limit=1)
    local = varstore.open(str(local_dir))
    for position in range(len(local.manifest.shards)):
        reader.shard(position)
    proxy.clear_counters()
    return {"reader": reader, "local": local, "proxy": proxy, "bucket": bucket, "records": records}


def expected_requests(local: Any, bucket: str, indices: np.ndarray, max_gap: int = 64 << 10) -> list[tuple[str, str]]:
    """The (path, Range) of each request a batch should make, from the local copy's offsets: per shard, its records'
    ranges sorted and joined across holes of at most `max_gap`."""
    expected = []
    for position, entry in enumerate(local.manifest.shards):
        start, stop = int(local.shard_starts[position]), int(local.shard_starts[position + 1])
        offsets = local.shard(position).offsets.astype(np.int64)
        spans: list[list[int]] = []
        for begin, end in sorted((int(offsets[i - start]), int(offsets[i - start + 1])) for i in indices if start <= i < stop):
            if spans and begin - spans[-1][1] <= max_gap:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([begin, end])
        expected += [(f"/{bucket}/ds/{entry.name}.data", f"bytes={begin}-{end - 1}") for begin, end in spans]
    return sorted(expected)


def test_a_batch_over_four_shards_makes_exactly_the_planned_requests(proxied_dataset: dict[str, Any]) -> None:
    reader, local, proxy, bucket = (proxied_dataset[key] for key in ("reader", "local", "proxy", "bucket"))
    indices = np.random.default_rng(5).choice(len(local), size=48, replace=False)
    assert reader.get_batch(indices) == [proxied_dataset["records"][i] for i in indices]
    assert sorted((record.path, record.range) for record in proxy.requests()) == expected_requests(local, bucket, indices)
    proxy.clear_counters()
    flat = reader.get_batch_flat(indices)
    assert [bytes(flat.values[flat.offsets[n] : flat.offsets[n + 1]]) for n in range(len(indices))] == [
        proxied_dataset["records"][i] for i in indices
    ]
    assert sorted((record.path, record.range) for record in proxy.requests()) == expected_requests(local, bucket, indices)


def test_a_request_failed_in_a_batch_is_made_again_alone(proxied_dataset: dict[str, Any]) -> None:
    """A retry fetches only what is missing: one 500 costs the batch one request more, not the batch again."""
    reader, local, proxy, bucket = (proxied_dataset[key] for key in ("reader", "local", "proxy", "bucket"))
    indices = np.array([3, 150, 41, 99, 120, 0, 77])
    planned = expected_requests(local, bucket, indices)
    victim = planned[2][0]
    proxy.server_error(times=1, method="GET", path=victim)
    assert reader.get_batch(indices) == [proxied_dataset["records"][i] for i in indices]
    seen = [(record.path, record.range) for record in proxy.requests()]
    assert len(seen) == len(planned) + 1 and sorted(set(seen)) == planned
    assert [record.path for record in proxy.requests() if record.fault] == [victim]


def test_the_shards_of_a_batch_share_one_plan(proxied_dataset: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """All shards' ranges go to the transport in one call (its requests then in flight together), not one call per
    shard; a shard whose data is local takes no part in it."""
    reader = proxied_dataset["reader"]
    calls: list[list[str]] = []
    real_read_batch = transport_module.FsspecTransport.read_batch

    def counted(self: Any, objects: Any) -> Any:
        calls.append([wanted.name for wanted in objects])
        return real_read_batch(self, objects)

    monkeypatch.setattr(transport_module.FsspecTransport, "read_batch", counted)
    assert reader.get_batch([159, 0, 45, 90]) == [proxied_dataset["records"][i] for i in (159, 0, 45, 90)]
    names = [entry.name for entry in proxied_dataset["local"].manifest.shards]
    assert calls == [[f"{reader.path}/{names[position]}.data" for position in (0, 1, 2, 3)]]
