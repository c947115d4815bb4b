"""Damaged and forged files never crash, hang or over-allocate a reader, and damage never passes silently.

Hypothesis mutates valid shards and manifests. Two kinds of mutation:

- damage (bit flips, truncation, extension, a data file or header swapped in from a twin shard): every
  open and read either raises a VarstoreError or returns the original record; with verify_reads, and
  after a passing verify(), no read returns anything but the original.
- forgery (header fields, offsets, checksums, metadata rewritten with every CRC recomputed, the way a
  malicious file would be made): reads may return whatever the forged file now says, but only through
  VarstoreErrors or results that agree across every way of reading.

For both, tracemalloc's peak during open and all reads stays below a bound proportional to the files.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import struct
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import header as fmt

from .helpers_reliability import (
    assert_reads_agree,
    assert_reads_match,
    exercise_store,
    header_field,
    make_records,
    read_shard_files,
    reseal_body,
    rewrite_header,
    sealed_manifest,
    with_metadata,
    write_shard_files,
)
from varstore.format.metadata import MAX_METADATA_SIZE

FUZZ = settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
MEMORY_SLACK = 2 << 20
MEMORY_FACTOR = 8

Shard = tuple[bytes, bytes, list[Any]]


def _records(kind: str) -> list[Any]:
    generator = np.random.default_rng(7)
    if kind == "bytes":
        return make_records(21, 30, 1000)
    if kind == "str-without-checksums":
        return ["", "plain", "ünïcödé ✓", "x" * 500] + [str(value) * value for value in range(12)]
    if kind == "ndarray":
        return [generator.integers(-9, 9, size=(length, 3)).astype(np.int16) for length in (0, 1, 5, 2, 0, 7, 3)]
    return [
        {"text": "sample", "tokens": np.arange(5, dtype=np.uint16), "nested": [[1, 2], {"k": None}], "blob": b"\x00\xff"},
        [],
        {"scalar": np.float32(1.5), "flag": True, "big": 2**63, "neg": -7},
        "just a string",
        {"empty": np.zeros((0, 4), np.float64), "deep": [[[[["five"]]]]]},
    ]


def temporary_directory() -> Path:
    """A directory for the module's cached files, removed when the process ends."""
    directory = tempfile.mkdtemp(prefix="varstore-fuzz-")
    atexit.register(shutil.rmtree, directory, True)
    return Path(directory)


@functools.lru_cache(maxsize=None)
def base_shards() -> dict[str, Shard]:
    """Valid shards to mutate, plus "twin": the bytes shard with the same sizes and first and last
    4 KiB but a different middle, the hardest data file to tell from the right one."""
    directory = temporary_directory()
    options = {
        "bytes": dict(codec="bytes", metadata={"source": "fuzz"}),
        "str-without-checksums": dict(codec="str", checksums=False),
        "ndarray": dict(codec="ndarray", dtype="int16", shape=(3,)),
        "msgpack": dict(codec="msgpack"),
    }
    shards = {}
    for kind, writer_options in options.items():
        records = _records(kind)
        with varstore.Writer(directory / kind, **writer_options) as writer:
            writer.extend(records)
        shards[kind] = (*read_shard_files(directory / kind), records)
    records = _records("bytes")
    total = sum(len(record) for record in records)
    starts = np.cumsum([0] + [len(record) for record in records[:-1]])
    twin = [bytes([record[0] ^ 0xFF]) + record[1:] if record and fmt.EDGE_SIZE <= start < total - fmt.EDGE_SIZE else record
            for record, start in zip(records, starts)]
    assert twin != records
    with varstore.Writer(directory / "twin", **options["bytes"]) as writer:
        writer.extend(twin)
    shards["twin"] = (*read_shard_files(directory / "twin"), twin)
    return shards


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def exercise_within_memory_bound(path: Path, sizes: int, **options: Any) -> dict[str, Any]:
    tracemalloc.start()
    try:
        outcomes = exercise_store(path, **options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = MEMORY_FACTOR * sizes + MEMORY_SLACK
    assert peak < bound, f"reading {sizes} bytes of files allocated {peak} bytes at peak (bound {bound})"
    return outcomes


# -- mutations ------------------------------------------------------------------------------------

BASE_NAMES = ("bytes", "str-without-checksums", "ndarray", "msgpack")
EDGE_VALUES = (0, 1, 7, 8, 63, 64, 65, 4095, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


def u64_near(original: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(EDGE_VALUES), st.sampled_from([max(0, original - 1), original + 1, original * 2]),
                     st.integers(0, 2**64 - 1))


@st.composite
def flipped(draw: st.DrawFn, content: bytes) -> bytes:
    if not content:
        return content
    damaged = bytearray(content)
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(content) - 1))
        damaged[position] ^= 1 << draw(st.integers(0, 7))
    return bytes(damaged)


@st.composite
def resized(draw: st.DrawFn, content: bytes) -> bytes:
    if draw(st.booleans()):
        return content[: draw(st.integers(0, max(0, len(content) - 1)))]
    return content + draw(st.binary(min_size=1, max_size=64))


@st.composite
def damaged_shard(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """(base name, index, data) after damage that no CRC was recomputed for."""
    base = draw(st.sampled_from(BASE_NAMES))
    index, data, _ = base_shards()[base]
    twin_index, twin_data, _ = base_shards()["twin"]
    kind = draw(st.sampled_from(("flip-index", "flip-data", "resize-index", "resize-data", "twin-data", "twin-header")))
    if kind == "flip-index":
        index = draw(flipped(index))
    elif kind == "flip-data":
        data = draw(flipped(data))
    elif kind == "resize-index":
        index = draw(resized(index))
    elif kind == "resize-data":
        data = draw(resized(data))
    elif kind == "twin-data":
        base, index = "bytes", base_shards()["bytes"][0]
        data = twin_data
    else:
        index = twin_index[: fmt.HEADER_SIZE] + index[fmt.HEADER_SIZE :]
    return base, index, data


HEADER_FIELDS = ("record_count", "data_size", "metadata_size", "flags", "codec", "minor", "major", "reserved_byte",
                 "data_crc32c", "data_edge_crc32c", "body_crc32c")
FIELD_LIMITS = {"flags": 2**16 - 1, "minor": 2**16 - 1, "major": 2**16 - 1, "codec": 255, "reserved_byte": 255,
                "data_crc32c": 2**32 - 1, "data_edge_crc32c": 2**32 - 1, "body_crc32c": 2**32 - 1}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@st.composite
def forged_metadata(draw: st.DrawFn, index: bytes) -> bytes:
    shape = draw(st.sampled_from(("json", "codec-params", "nested", "not-utf8")))
    if shape == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if shape == "codec-params":
        params = draw(st.dictionaries(st.sampled_from(["dtype", "shape"]), JSON_VALUES | st.sampled_from(
            ["<f4", "|O", ">i4", "<V8", [0], [2**40], [1] * 40, [-1]]), max_size=2))
        return json.dumps({"codec": params, "user": {}}).encode()
    if shape == "nested":
        depth = draw(st.integers(1, 100_000))
        return b"[" * depth + b"]" * depth
    return b'{"codec": {}, "user": {"x": "\xff\xfe"}}'


@st.composite
def forged_shard(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """(base name, index, data) rewritten by someone who recomputes every checksum."""
    base = draw(st.sampled_from(BASE_NAMES))
    index, data, records = base_shards()[base]
    count = len(records)
    offsets_start = fmt.align8(fmt.HEADER_SIZE + header_field(index, "metadata_size"))
    kind = draw(st.sampled_from(("header", "offsets", "checksums", "metadata", "body-flips")))
    if kind == "header":
        field = draw(st.sampled_from(HEADER_FIELDS))
        original = header_field(index, field)
        value = draw(u64_near(original).filter(lambda v: v <= FIELD_LIMITS.get(field, 2**64 - 1)))
        index = rewrite_header(index, **{field: value})
    elif kind == "offsets":
        for _ in range(draw(st.integers(1, 3))):
            position = draw(st.integers(0, count))
            neighbour = struct.unpack_from("<Q", index, offsets_start + 8 * max(0, position - 1))[0]
            value = draw(u64_near(neighbour) | st.integers(0, len(data)))
            index = index[: offsets_start + 8 * position] + struct.pack("<Q", value) + index[offsets_start + 8 * position + 8 :]
        index = reseal_body(index)
    elif kind == "checksums":
        checksums_start = offsets_start + 8 * (count + 1)
        index = reseal_body(index[:checksums_start] + draw(flipped(index[checksums_start:])))
    elif kind == "metadata":
        index = with_metadata(index, draw(forged_metadata(index)))
    else:
        index = reseal_body(index[: fmt.HEADER_SIZE] + draw(flipped(index[fmt.HEADER_SIZE :])))
    if draw(st.integers(0, 3)) == 0:  # sometimes damage on top of forgery
        data = draw(flipped(data) | resized(data))
    return base, index, data


# -- shards ---------------------------------------------------------------------------------------


@FUZZ
@given(shard=damaged_shard())
def test_damaged_shard_is_refused_or_read_unchanged(workspace, shard):
    base, index, data = shard
    prefix = workspace / "damaged"
    write_shard_files(prefix, index, data)
    original = base_shards()[base][2]
    for checked in (False, True) if base != "str-without-checksums" else (False,):
        outcomes = exercise_within_memory_bound(prefix, len(index) + len(data), verify_reads=checked)
        assert_reads_agree(outcomes)
        assert_reads_match(outcomes, original, checked=checked)


@FUZZ
@given(shard=forged_shard())
def test_forged_shard_gives_varstore_errors_or_consistent_reads_within_bounded_memory(workspace, shard):
    _, index, data = shard
    prefix = workspace / "forged"
    write_shard_files(prefix, index, data)
    for checked in (False, True):
        assert_reads_agree(exercise_within_memory_bound(prefix, len(index) + len(data), verify_reads=checked))


@pytest.mark.parametrize("field, value", [("record_count", 2**64 - 1), ("record_count", 2**61), ("metadata_size", 2**64 - 1),
                                          ("metadata_size", MAX_METADATA_SIZE + 1), ("data_size", 2**64 - 1),
                                          ("data_size", 2**63)])
def test_huge_sizes_in_a_forged_header_are_refused_before_any_allocation(workspace, field, value):
    index, data, _ = base_shards()["bytes"]
    write_shard_files(workspace / "huge", rewrite_header(index, **{field: value}), data)
    outcomes = exercise_within_memory_bound(workspace / "huge", len(index) + len(data))
    assert isinstance(outcomes["open"], varstore.FormatError)


def test_twin_data_file_passes_open_but_not_verification(workspace):
    """The one damage open cannot see (same size, same first and last 4 KiB): verify and checked reads can."""
    index, _, records = base_shards()["bytes"]
    _, twin_data, twin_records = base_shards()["twin"]
    write_shard_files(workspace / "twin-data", index, twin_data)
    with varstore.open(workspace / "twin-data") as store:
        with pytest.raises(varstore.CorruptRecordError) as caught:
            store.verify()
    changed = [number for number, (a, b) in enumerate(zip(records, twin_records)) if a != b]
    assert caught.value.records == changed
    with varstore.open(workspace / "twin-data", verify_reads=True) as store:
        with pytest.raises(varstore.CorruptRecordError, match=f"record {changed[0]} checksum"):
            store[changed[0]]


# -- manifests ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def base_dataset() -> tuple[Path, bytes, list[bytes]]:
    directory = temporary_directory()
    records = make_records(22, 40)
    with varstore.ShardedWriter(directory, max_shard_records=15) as writer:
        writer.extend(records)
    return directory, (directory / "manifest.json").read_bytes(), records


def exercise_manifest(manifest: bytes) -> tuple[dict[str, Any], list[bytes]]:
    directory, _, records = base_dataset()
    (directory / "manifest.json").write_bytes(manifest)
    sizes = len(manifest) + sum(os.path.getsize(directory / name) for name in os.listdir(directory))
    return exercise_within_memory_bound(directory, sizes), records


@st.composite
def forged_manifest(draw: st.DrawFn) -> bytes:
    document = json.loads(base_dataset()[1])
    shards = document["shards"]
    kind = draw(st.sampled_from(("top-level", "entry-field", "entries", "name")))
    if kind == "top-level":
        key = draw(st.sampled_from(["format", "version", "codec", "metadata", "shards"]))
        if draw(st.booleans()):
            document[key] = draw(JSON_VALUES)
        else:
            del document[key]
    elif kind == "entry-field":
        entry = shards[draw(st.integers(0, len(shards) - 1))]
        key = draw(st.sampled_from(["name", "records", "data_size", "index_size", "index_crc32c", "data_crc32c"]))
        entry[key] = draw(JSON_VALUES | u64_near(entry[key] if isinstance(entry[key], int) else 0) | st.integers(-(2**64), -1))
    elif kind == "entries":
        order = draw(st.lists(st.integers(0, len(shards) - 1), max_size=6))
        document["shards"] = [dict(shards[position]) for position in order]
    else:
        entry = shards[draw(st.integers(0, len(shards) - 1))]
        entry["name"] = draw(st.sampled_from(["..", ".", "../shard-000000", "/etc/passwd", "a/b", ".hidden", "",
                                              "shard-000000.varstore-tmp-0", "x" * 201, "shard\x00", "manifest.json"])
                             | st.text(max_size=12))
    return sealed_manifest(document) if draw(st.booleans()) else json.dumps(document).encode()


@FUZZ
@given(manifest=forged_manifest())
def test_forged_manifest_gives_varstore_errors_or_consistent_reads(manifest):
    outcomes, _ = exercise_manifest(manifest)
    assert_reads_agree(outcomes)


@FUZZ
@given(manifest=st.deferred(lambda: flipped(base_dataset()[1]) | resized(base_dataset()[1])))
def test_damaged_manifest_is_refused_or_reads_the_original_dataset(manifest):
    outcomes, records = exercise_manifest(manifest)
    assert_reads_agree(outcomes)
    assert_reads_match(outcomes, records, checked=False)
