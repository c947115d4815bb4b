"""`extend` encodes and buffers 1,024 records at a time (`varstore.shard.writer.extend_in_chunks`); what it stores, what it
refuses, and what it keeps when the iterable fails must be exactly what `append` per record gives.

Every write runs under `write_budget`: a writer that writes more than its records' payloads and index entries
(a runaway buffering loop, say) fails the test at once instead of filling the disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from array import array
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st

import varstore
from varstore.shard import writer as writer_module
from varstore.format.codecs import make_codec
from varstore.errors import ClosedError, RecordTypeError

pytestmark = pytest.mark.timeout(150)

MiB = 1 << 20
CHUNK = writer_module._EXTEND_CHUNK
# Payload sizes around the 1 MiB write buffer, where the buffer's room can end at 0 or below it.
SIZES_AROUND_THE_BUFFER = (MiB, MiB - 64, MiB - 63, MiB - 65, MiB - 1, MiB + 1, MiB - 128)
# Positions around the chunk boundaries, for a refused record or an iterable's failure.
AROUND_CHUNK_BOUNDARIES = (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 1)
WAYS = ("list", "tuple", "generator", "append")
# Hypothesis examples reuse the test's tmp_path: each example writes in its own subdirectory, removed after it.
# No shrinking: shrinking a failing example of thousands of records and many shards outlasts the test's timeout;
# the example is reported as found (derandomized, so a rerun finds it again) and the parametrized tests pin the edges.
SETTINGS = dict(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                phases=(Phase.explicit, Phase.reuse, Phase.generate))


class RunawayWrite(AssertionError):
    """A writer wrote more bytes than the records it was given can account for."""


class IterableFailed(Exception):
    """Raised by a test's generator after it yielded its records."""


@contextlib.contextmanager
def write_budget(limit: int) -> Iterator[None]:
    """Fail the first write that takes the bytes every Writer writes (data, index, spooled checksums) past `limit`."""
    real_write_all = writer_module.write_all
    written = 0

    def counted_write_all(fd: int, data: Any) -> None:
        nonlocal written
        written += memoryview(data).nbytes
        if written > limit:
            raise RunawayWrite(f"writers wrote {written} bytes, more than the {limit} their records account for")
        real_write_all(fd, data)

    with mock.patch.object(writer_module, "write_all", counted_write_all):
        yield


def payload_sizes(codec: Any, records: Iterable[Any]) -> list[int]:
    return [memoryview(codec.encode(record)).nbytes for record in records]


def budget_for(sizes: list[int], shards: int = 1) -> int:
    """Payloads, an offset and a checksum twice (spooled, then copied into the index) per record, and headers."""
    return sum(sizes) + 16 * len(sizes) + 64 * 1024 * (shards + 1)


def give(records: list[Any], way: str, target: Any) -> None:
    """Hand `records` to `target` in one of the four ways whose results must agree."""
    if way == "list":
        target.extend(list(records))
    elif way == "tuple":
        target.extend(tuple(records))
    elif way == "generator":
        target.extend(record for record in records)
    else:
        for record in records:
            target.append(record)


def files_of(path: Path) -> dict[str, bytes]:
    """Every file a dataset directory, or a shard prefix (named by suffix), consists of."""
    if path.is_dir():
        return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}
    return {name[len(path.name):]: (path.parent / name).read_bytes()
            for name in sorted(os.listdir(path.parent)) if name.startswith(path.name + ".")}


def assert_same_files(stored: dict[str, bytes], reference: dict[str, bytes], what: str) -> None:
    """Names and bytes equal; a difference is reported by file and first differing offset, not by dumping megabytes."""
    assert sorted(stored) == sorted(reference), f"{what}: files {sorted(stored)} != {sorted(reference)}"
    for name in reference:
        if stored[name] != reference[name]:
            a, b = stored[name], reference[name]
            first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            pytest.fail(f"{what}: {name} differs ({len(a)} vs {len(b)} bytes, first at byte {first})")


def assert_same_record(stored: Any, expected: Any) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(stored, np.ndarray) and stored.dtype == expected.dtype and np.array_equal(stored, expected)
    elif isinstance(expected, dict):
        assert isinstance(stored, dict) and list(stored) == list(expected)
        for key in expected:
            assert_same_record(stored[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(stored, list) and len(stored) == len(expected)
        for item, expected_item in zip(stored, expected):
            assert_same_record(item, expected_item)
    else:
        assert type(stored) is type(expected) and stored == expected


def read_back(path: Path) -> list[Any]:
    opened = varstore.open(path)
    try:
        return list(opened)
    finally:
        opened.close()


# --- record generators --------------------------------------------------------------------------------------------


def as_bytes_like(payload: bytes, kind: str) -> Any:
    """`payload` as one of the objects the bytes codec takes; bytes(result) == payload."""
    if kind == "bytearray":
        return bytearray(payload)
    if kind == "memoryview":
        return memoryview(payload)
    if kind == "strided":  # not contiguous: the codec copies it
        spread = bytearray(2 * len(payload))
        spread[::2] = payload
        return memoryview(bytes(spread))[::2]
    if kind == "2d" and payload:
        return memoryview(payload).cast("B", (1, len(payload)))
    if kind == "wide" and len(payload) % 4 == 0:  # items of 4 bytes: stored as their bytes
        return memoryview(array("I", payload))
    return payload


BYTES_KINDS = ("bytes", "bytearray", "memoryview", "strided", "2d", "wide")


def tiny_bytes(count: int, seed: int, kinds: tuple[str, ...]) -> list[Any]:
    return [as_bytes_like(bytes([(seed + i) % 256]) * ((seed + i) % 9), kinds[(seed + i) % len(kinds)]) for i in range(count)]


def large_payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


run_lengths = st.one_of(st.sampled_from((1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3)), st.integers(0, 1500))


@st.composite
def bytes_records(draw: Any) -> list[Any]:
    """Runs of tiny records, small ones of any bytes-like kind, and at most two large ones around the buffer size."""
    kinds = draw(st.sampled_from((("bytes",), BYTES_KINDS)))
    pieces: list[list[Any]] = draw(st.lists(st.one_of(
        st.builds(tiny_bytes, run_lengths, st.integers(0, 255), st.just(kinds)),
        st.builds(lambda data, kind: [as_bytes_like(data, kind)], st.binary(max_size=300), st.sampled_from(BYTES_KINDS)),
    ), max_size=5))
    for _ in range(draw(st.integers(0, 2))):
        size = draw(st.one_of(st.sampled_from(SIZES_AROUND_THE_BUFFER), st.integers(MiB // 2, MiB + 4096)))
        large = as_bytes_like(large_payload(size, draw(st.integers(0, 9))), draw(st.sampled_from(("bytes", "bytearray", "memoryview"))))
        pieces.insert(draw(st.integers(0, len(pieces))), [large])
    return [record for piece in pieces for record in piece]


@st.composite
def str_records(draw: Any) -> list[Any]:
    pieces: list[list[str]] = draw(st.lists(st.one_of(
        st.builds(lambda count, seed: [chr(0x41 + (seed + i) % 900) * ((seed + i) % 5) for i in range(count)],
                  run_lengths, st.integers(0, 255)),
        st.lists(st.text(max_size=40), max_size=5),
    ), max_size=5))
    for _ in range(draw(st.integers(0, 2))):
        size = draw(st.sampled_from(SIZES_AROUND_THE_BUFFER))
        pieces.insert(draw(st.integers(0, len(pieces))), ["é" * (size // 2) + "x" * (size % 2)])  # é is 2 bytes
    return [record for piece in pieces for record in piece]


# (dtype, trailing shape) of the ndarray shards; and dtypes each can take without changing values.
NDARRAY_SHARDS = (
    ("<i2", (), ("<i2", "|i1", "|u1", ">i2", "<i8")),
    ("<f4", (3,), ("<f4", "<f2", "|i1", ">f4")),
    ("|u1", (2, 2), ("|u1", "|b1", "<i4")),
    ("<f8", (), ("<f8", "<f4", "<i4")),
    ("|b1", (), ("|b1",)),
)


def array_record(dtype: str, shape: tuple[int, ...], source_dtype: str, rows: int, seed: int, layout: str) -> np.ndarray:
    """`rows` rows of values every dtype of the shard's row holds exactly, as `source_dtype`, laid out as asked."""
    values = (np.arange(rows * int(np.prod(shape)), dtype=np.int64) + seed) % (2 if "b1" in dtype + source_dtype else 100)
    array = values.astype(source_dtype).reshape((rows, *shape))
    if layout == "strided":  # every other row of a twice as long array
        doubled = np.repeat(array, 2, axis=0)
        doubled[1::2] = 0
        array = doubled[::2]
    elif layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "list":
        return array.tolist()  # type: ignore[return-value]
    return array


def ndarray_records(dtype: str, shape: tuple[int, ...], castable: tuple[str, ...]) -> Any:
    row_size = np.dtype(dtype).itemsize * int(np.prod(shape))
    small = st.builds(lambda source, rows, seed, layout: [array_record(dtype, shape, source, rows, seed, layout)],
                      st.sampled_from(castable), st.integers(0, 40), st.integers(0, 99),
                      st.sampled_from(("plain", "plain", "strided", "fortran", "list")))
    run = st.builds(lambda count, seed: [array_record(dtype, shape, dtype, (seed + i) % 4, seed + i, "plain") for i in range(count)],
                    run_lengths, st.integers(0, 99))

    @st.composite
    def records(draw: Any) -> list[Any]:
        pieces: list[list[Any]] = draw(st.lists(st.one_of(small, run), max_size=5))
        for _ in range(draw(st.integers(0, 2))):
            rows = -(-draw(st.sampled_from(SIZES_AROUND_THE_BUFFER)) // row_size)
            pieces.insert(draw(st.integers(0, len(pieces))), [array_record(dtype, shape, dtype, rows, draw(st.integers(0, 9)), "plain")])
        return [record for piece in pieces for record in piece]

    return records()


msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), st.text(max_size=20),
              st.binary(max_size=40), st.builds(lambda n: np.arange(n, dtype="<i4"), st.integers(0, 5))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def msgpack_records(draw: Any) -> list[Any]:
    pieces: list[list[Any]] = draw(st.lists(st.one_of(
        st.builds(lambda count, seed: [{"i": seed + i, "t": "x" * ((seed + i) % 7)} for i in range(count)], run_lengths, st.integers(0, 99)),
        st.lists(msgpack_values, max_size=5),
    ), max_size=5))
    for _ in range(draw(st.integers(0, 2))):
        size = draw(st.sampled_from(SIZES_AROUND_THE_BUFFER))
        pieces.insert(draw(st.integers(0, len(pieces))), [large_payload(size - 5, draw(st.integers(0, 9)))])  # bin 32: 5 bytes of head
    return [record for piece in pieces for record in piece]


def expected_record(codec: Any, record: Any) -> Any:
    """What a reader returns for `record` (for msgpack: as the reference writer's own read-back shows)."""
    if codec.name == "bytes":
        return bytes(record)
    if codec.name == "ndarray":
        return np.asarray(record).astype(codec.dtype)
    return record


# --- the four ways agree ------------------------------------------------------------------------------------------


def shard_maker(codec: str, **options: Any) -> Callable[[Path], varstore.Writer]:
    return lambda path: varstore.Writer(path, codec, **options)


def dataset_maker(codec: str, **options: Any) -> Callable[[Path], varstore.ShardedWriter]:
    return lambda path: varstore.ShardedWriter(path, codec, **options)


def check_four_ways_agree(tmp_path: Path, records: list[Any], prefix: int, make: Callable[[Path], Any], shards: int = 1) -> None:
    """Write `records` once per way (the first `prefix` of them appended one by one each time, so extend starts on a
    buffer with less room): all four store the same bytes, and they read back as the records."""
    note = event if currently_in_test_context() else lambda _: None  # how often examples reach the edges
    note(f"more than a chunk: {len(records) - prefix > CHUNK}")
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        stored_files = {}
        for way in WAYS:
            target = make(base / way)
            sizes = payload_sizes(target._codec, records)
            note(f"records around the buffer's size: {sum(size > MiB // 2 for size in sizes)}")
            with write_budget(budget_for(sizes, shards)):
                give(records[:prefix], "append", target)
                give(records[prefix:], way, target)
                assert len(target) == len(records)
                target.close()
            stored_files[way] = files_of(base / way)
        for way in ("list", "tuple", "generator"):
            assert_same_files(stored_files[way], stored_files["append"], f"extend({way}) against append")
        data_size = sum(len(content) for name, content in stored_files["append"].items() if name.endswith(".data"))
        assert data_size == sum(sizes)
        stored = read_back(base / "append")
        assert len(stored) == len(records)
        for item, record in zip(stored, records):
            assert_same_record(item, expected_record(target._codec, record))
    finally:
        shutil.rmtree(base, ignore_errors=True)


prefixes = st.integers(0, 3)


@settings(max_examples=25, **SETTINGS)
@given(records=bytes_records(), prefix=prefixes)
def test_writer_extend_of_bytes_like_records_stores_what_append_stores(tmp_path, records, prefix):
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), shard_maker("bytes"))


@settings(max_examples=15, **SETTINGS)
@given(records=str_records(), prefix=prefixes)
def test_writer_extend_of_str_records_stores_what_append_stores(tmp_path, records, prefix):
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), shard_maker("str"))


@pytest.mark.parametrize("dtype, shape, castable", NDARRAY_SHARDS, ids=[f"{d}{s}" for d, s, _ in NDARRAY_SHARDS])
@settings(max_examples=8, **SETTINGS)
@given(data=st.data(), prefix=prefixes)
def test_writer_extend_of_arrays_of_any_castable_dtype_and_layout_stores_what_append_stores(tmp_path, dtype, shape, castable, data, prefix):
    records = data.draw(ndarray_records(dtype, shape, castable))
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), shard_maker("ndarray", dtype=dtype, shape=shape))


@settings(max_examples=15, **SETTINGS)
@given(records=msgpack_records(), prefix=prefixes)
def test_writer_extend_of_msgpack_records_stores_what_append_stores(tmp_path, records, prefix):
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), shard_maker("msgpack"))


SHARD_LIMITS = st.tuples(
    st.sampled_from((4096, 64 * 1024, MiB - 64, MiB, MiB + 1, 3 * MiB, 256 * MiB)),
    st.sampled_from((None, 300, CHUNK - 1, CHUNK, CHUNK + 1)),
)


MAX_SHARDS = 12  # each shard costs fsyncs: an example (and shrinking a failing one) stays fast


def shard_count_bound(sizes: list[int], max_bytes: int, max_records: int | None) -> int:
    by_records = len(sizes) // max_records + 1 if max_records else 1
    return by_records + sum(sizes) // max_bytes + sum(size > max_bytes // 2 for size in sizes) + 1


@settings(max_examples=25, **SETTINGS)
@given(records=bytes_records(), prefix=prefixes, limits=SHARD_LIMITS)
def test_sharded_extend_splitting_chunks_across_shards_stores_what_append_stores(tmp_path, records, prefix, limits):
    max_bytes, max_records = limits
    shards = shard_count_bound(payload_sizes(make_codec("bytes"), records), max_bytes, max_records)
    if shards > MAX_SHARDS:  # each shard costs fsyncs: keep the example fast
        max_bytes = 256 * MiB
        shards = shard_count_bound(payload_sizes(make_codec("bytes"), records), max_bytes, max_records)
    make = dataset_maker("bytes", max_shard_bytes=max_bytes, max_shard_records=max_records)
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), make, shards)


@settings(max_examples=10, **SETTINGS)
@given(data=st.data(), prefix=prefixes, limits=SHARD_LIMITS, shard=st.sampled_from(NDARRAY_SHARDS[:3]))
def test_sharded_extend_of_arrays_across_shards_stores_what_append_stores(tmp_path, data, prefix, limits, shard):
    dtype, shape, castable = shard
    records = data.draw(ndarray_records(dtype, shape, castable))
    codec = make_codec("ndarray", dtype=dtype, shape=shape)
    max_bytes, max_records = limits
    if shard_count_bound(payload_sizes(codec, records), max_bytes, max_records) > MAX_SHARDS:
        max_bytes = 256 * MiB
    shards = shard_count_bound(payload_sizes(codec, records), max_bytes, max_records)
    make = dataset_maker("ndarray", dtype=dtype, shape=shape, max_shard_bytes=max_bytes, max_shard_records=max_records)
    check_four_ways_agree(tmp_path, records, min(prefix, len(records)), make, shards)


@settings(max_examples=10, **SETTINGS)
@given(records=st.one_of(str_records(), msgpack_records()), limits=SHARD_LIMITS)
def test_sharded_extend_of_str_and_msgpack_records_stores_what_append_stores(tmp_path, records, limits):
    codec = "str" if all(isinstance(record, str) for record in records) and records else "msgpack"
    sizes = payload_sizes(make_codec(codec), records)
    max_bytes, max_records = limits
    if shard_count_bound(sizes, max_bytes, max_records) > MAX_SHARDS:
        max_bytes = 256 * MiB
    make = dataset_maker(codec, max_shard_bytes=max_bytes, max_shard_records=max_records)
    check_four_ways_agree(tmp_path, records, 0, make, shard_count_bound(sizes, max_bytes, max_records))


@pytest.mark.parametrize("max_bytes", (25_000, 24_999))
@pytest.mark.parametrize("max_records", (None, 200, 251, CHUNK - 5))
@pytest.mark.parametrize("prefix", (0, 3))
def test_sharded_extend_fills_each_shard_exactly_to_its_limits_inside_a_chunk(tmp_path, max_bytes, max_records, prefix):
    """Records of 100 bytes (every 11th empty) fill max_shard_bytes exactly, or overshoot it by one byte, inside
    chunks: the record ending at the limit and the empty ones after it stay in their shard, the one ending a byte
    past it begins another, as with append."""
    records = [bytes([i % 256]) * (0 if i % 11 == 10 else 100) for i in range(CHUNK + 300)]
    make = dataset_maker("bytes", max_shard_bytes=max_bytes, max_shard_records=max_records)
    check_four_ways_agree(tmp_path, records, prefix, make, shards=len(records) // (max_records or CHUNK) + 7)


@pytest.mark.parametrize("first", SIZES_AROUND_THE_BUFFER)
def test_a_record_filling_the_buffer_then_more_in_the_same_chunk_stores_what_append_stores(tmp_path, first):
    """The runaway case: a record of about the buffer's size leaves its room at or below 0 mid-chunk."""
    records = [b"a" * 10, large_payload(first, 1), b"b", b"", large_payload(first, 2), b"c" * 100] + tiny_bytes(CHUNK, 3, ("bytes",))
    check_four_ways_agree(tmp_path, records, 0, shard_maker("bytes"))
    check_four_ways_agree(tmp_path, records, 0, dataset_maker("bytes", max_shard_bytes=first + 11))


# --- refusals, failing iterables, closed writers ------------------------------------------------------------------

# A record each codec refuses, and a record it takes.
REFUSED = {
    "bytes": ({}, 12345, b"ok"),
    "str": ({}, "\ud800", "ok"),
    "ndarray": ({"dtype": "<i2", "shape": (2,)}, np.zeros((1, 3), "<i2"), np.ones((1, 2), "<i2")),
    "msgpack": ({}, {"x": object()}, {"ok": 1}),
}
WRITERS = {
    "Writer": lambda path, codec, options: varstore.Writer(path, codec, **options),
    "ShardedWriter": lambda path, codec, options: varstore.ShardedWriter(path, codec, max_shard_records=700, **options),
}
PREFIX = 5  # records appended before extend, so a dataset-level position differs from the position in the iterable


def taken_records(codec: str, count: int) -> list[Any]:
    good = REFUSED[codec][2]
    if codec == "bytes":
        return [bytes([i % 256]) * (i % 4) for i in range(count)]
    return [good] * count


@pytest.mark.parametrize("way", ("list", "tuple", "generator"))
@pytest.mark.parametrize("writer_kind", WRITERS)
@pytest.mark.parametrize("codec", REFUSED)
@pytest.mark.parametrize("position", AROUND_CHUNK_BOUNDARIES + (500, 2 * CHUNK + 500))
def test_a_refused_record_inside_a_chunk_is_named_and_the_records_before_it_land(tmp_path, position, codec, writer_kind, way):
    options, refused, _ = REFUSED[codec]
    records = taken_records(codec, position) + [refused] + taken_records(codec, 40)
    landed = {}
    for how in (way, "append"):
        path = tmp_path / how
        target = WRITERS[writer_kind](path, codec, options)
        with write_budget(budget_for(payload_sizes(target._codec, records[:position]) + [0] * PREFIX, 4)):
            give(taken_records(codec, PREFIX), "append", target)
            with pytest.raises(RecordTypeError, match=rf": record {PREFIX + position}: ") as raised:
                give(records, how, target)
            assert str(path) in str(raised.value)
            assert len(target) == PREFIX + position
            target.close()
        landed[how] = files_of(path)
    assert_same_files(landed[way], landed["append"], f"extend({way}) refusing record {position} against append")
    stored = read_back(tmp_path / way)
    codec_object = make_codec(codec, **options)
    expected = taken_records(codec, PREFIX) + records[:position]
    assert len(stored) == len(expected)
    for item, record in zip(stored, expected):
        assert_same_record(item, expected_record(codec_object, record))


def failing_after(records: list[Any], count: int) -> Iterator[Any]:
    yield from records[:count]
    raise IterableFailed(f"after {count} records")


@pytest.mark.parametrize("writer_kind", WRITERS)
@pytest.mark.parametrize("count", AROUND_CHUNK_BOUNDARIES + (3 * CHUNK - 1,))
def test_records_an_iterable_gave_before_it_raised_are_kept_and_its_error_propagates(tmp_path, count, writer_kind):
    records = tiny_bytes(count, 7, BYTES_KINDS)
    if count > 2:  # a record leaving the buffer no room, in the middle
        records[count // 2] = large_payload(MiB - 64, 1)
    landed = {}
    for how in ("extend", "append"):
        path = tmp_path / how
        target = WRITERS[writer_kind](path, "bytes", {})
        with write_budget(budget_for(payload_sizes(target._codec, records), 8)):
            with pytest.raises(IterableFailed, match=f"after {count} records"):
                if how == "extend":
                    target.extend(failing_after(records, count))
                else:
                    for record in failing_after(records, count):
                        target.append(record)
            assert len(target) == count
            target.close()
        landed[how] = files_of(path)
    assert_same_files(landed["extend"], landed["append"], f"extend of an iterable failing after {count} records")
    assert read_back(tmp_path / "extend") == [bytes(record) for record in records]


@pytest.mark.parametrize("writer_kind", WRITERS)
def test_extend_on_a_closed_writer_is_refused_as_append_is_and_an_empty_iterable_does_nothing(tmp_path, writer_kind):
    target = WRITERS[writer_kind](tmp_path / "closed", "bytes", {})
    target.append(b"kept")
    target.close()
    before = files_of(tmp_path / "closed")
    # Nothing to append: append is never called, so nothing is refused (as with a loop of append over no records).
    target.extend([])
    target.extend(())
    target.extend(iter([]))
    for records in ([b"x"], (b"x",), iter([b"x"]), [b"x"] * (CHUNK + 1), [12345], [b"x", 12345], iter([bytearray(b"y")])):
        with write_budget(0), pytest.raises(ClosedError, match="closed writer"):
            target.extend(records)
    for record in (b"x", 12345):
        with pytest.raises(ClosedError, match="closed writer"):
            target.append(record)
    assert len(target) == 1
    assert files_of(tmp_path / "closed") == before
    assert read_back(tmp_path / "closed") == [b"kept"]


@pytest.mark.parametrize("writer_kind", WRITERS)
@pytest.mark.parametrize("count", (3, CHUNK + 3))
def test_bytes_like_and_array_records_changed_after_extend_returns_are_stored_as_given(tmp_path, writer_kind, count):
    originals = [bytes([i % 256]) * (1 + i % 5) for i in range(count)] + [large_payload(MiB + 1, 3)]
    owned = [bytearray(payload) for payload in originals]
    views = [memoryview(bytearray(payload)) for payload in originals]
    arrays = [np.full(1 + i % 5, i, "<i4") for i in range(count)]
    targets = {name: WRITERS[writer_kind](tmp_path / name, codec, options) for name, codec, options in
               (("owned", "bytes", {}), ("views", "bytes", {}), ("arrays", "ndarray", {"dtype": "<i4"}))}
    targets["owned"].extend(owned)
    targets["views"].extend(view for view in views)
    targets["arrays"].extend(tuple(arrays))
    for changed in owned + [view.obj for view in views]:
        changed[:] = b"\xff" * len(changed)
    for array_record_ in arrays:
        array_record_[:] = -1
    for target in targets.values():
        target.close()
    assert read_back(tmp_path / "owned") == originals
    assert read_back(tmp_path / "views") == originals
    assert [record.tolist() for record in read_back(tmp_path / "arrays")] == [[i] * (1 + i % 5) for i in range(count)]


# --- where extend is not yet what append per record is -------------------------------------------------------------


def reusing_one_buffer(payloads: list[bytes]) -> Iterator[bytearray]:
    """Yields the same bytearray each time, filled with the next payload: a reader reusing its buffer (readinto)."""
    buffer = bytearray(len(payloads[0]))
    for payload in payloads:
        buffer[:] = payload
        yield buffer


@pytest.mark.parametrize("writer_kind", WRITERS)
def test_a_generator_reusing_one_buffer_for_each_record_stores_each_record_as_yielded(tmp_path, writer_kind):
    payloads = [bytes([i]) * 4 for i in range(3)]
    target = WRITERS[writer_kind](tmp_path / "reused", "bytes", {})
    target.extend(reusing_one_buffer(payloads))
    target.close()
    assert read_back(tmp_path / "reused") == payloads


@pytest.mark.parametrize("writer_kind", WRITERS)
def test_after_a_refused_record_the_iterator_continues_just_past_it(tmp_path, writer_kind):
    records = [b"a", 12345, b"b", b"c"]
    remaining = iter(records)
    target = WRITERS[writer_kind](tmp_path / "skipping", "bytes", {})
    with pytest.raises(RecordTypeError, match="record 1: "):
        target.extend(remaining)
    target.extend(remaining)  # skip the refused record and carry on
    target.close()
    assert read_back(tmp_path / "skipping") == [b"a", b"b", b"c"]
