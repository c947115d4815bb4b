"""Shard metadata: strict JSON only (what another parser could read differently is refused), a nesting limit
enforced without recursion, and an open shard that keeps no parsed metadata, with a bounded transient cost."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import pytest

import varstore

from .helpers_reliability import read_shard_files, with_metadata, write_shard_files

# §1.4: parsing metadata_size bytes of JSON may allocate up to this many times as much, transiently.
PARSE_FACTOR = 48


def forged_shard(tmp_path, metadata: bytes) -> str:
    """A one-record shard whose metadata block is `metadata`, every size and checksum consistent."""
    prefix = tmp_path / "docs"
    with varstore.Writer(prefix) as writer:
        writer.append(b"record")
    index, data = read_shard_files(prefix)
    write_shard_files(prefix, with_metadata(index, metadata), data)
    return str(prefix)


def nested_lists(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("metadata, problem", [
    (b'{"codec":{},"user":{"x":NaN}}', "NaN is not a JSON number"),
    (b'{"codec":{},"user":{"x":Infinity}}', "Infinity is not a JSON number"),
    (b'{"codec":{},"user":{"x":[-Infinity]}}', "-Infinity is not a JSON number"),
    (b'{"codec":{},"user":{"x":1e400}}', "1e400 overflows to infinity"),
    (b'{"codec":{},"user":{},"user":{"x":1}}', "member name 'user' appears twice"),
    (b'{"codec":{"dtype":"<u2","dtype":"<f4"},"user":{}}', "member name 'dtype' appears twice"),
    (b'{"codec":{},"user":{"a":[{"k":1,"k":1}]}}', "member name 'k' appears twice"),
    (b'{"codec":{},"user":{"x":"\\ud800"}}', "lone surrogate"),
    (b'{"codec":{},"user":{"\\udc00":1}}', "lone surrogate"),
    (b'{"codec":{},"user":{"x":["\\udc00\\ud800"]}}', "lone surrogate"),
    (b'\xef\xbb\xbf{"codec":{},"user":{}}', "byte order mark"),
    (b'{"codec":{},"user":{"x":[18446744073709551616]}}', r"integer 18446744073709551616 is outside \[-2\*\*63, 2\*\*64\)"),
    (b'{"codec":{},"user":{"x":-9223372036854775809}}', r"integer -9223372036854775809 is outside \[-2\*\*63, 2\*\*64\)"),
    (b'{"codec":{},"user":{"x":' + b"[" * 63 + b"]" * 63 + b"}}", "nest 65 deep, over the limit of 64"),
])
def test_metadata_that_strict_parsers_would_read_differently_is_refused(tmp_path, metadata, problem):
    path = forged_shard(tmp_path, metadata)
    with pytest.raises(varstore.FormatError, match=rf"docs\.index: metadata is not valid UTF-8 JSON: .*{problem}"):
        varstore.open(path)


def test_escaped_surrogate_pairs_and_escaped_backslashes_are_ordinary_metadata(tmp_path):
    path = forged_shard(tmp_path, b'{"codec":{},"user":{"emoji":"\\ud83d\\ude00","path":"C:\\\\ud800\\\\"}}')
    assert varstore.open(path).metadata == {"emoji": "\N{GRINNING FACE}", "path": "C:\\ud800\\"}


def test_writer_refuses_metadata_holding_a_lone_surrogate_naming_it(tmp_path):
    with pytest.raises(varstore.FormatError, match=r"lone surrogate '\\ud800'"):
        varstore.Writer(tmp_path / "docs", metadata={"name": "bad \ud800 text"})
    with pytest.raises(varstore.FormatError, match=r"lone surrogate"):
        varstore.Writer(tmp_path / "docs", metadata={"\udfff": 1})


def test_metadata_nests_64_deep_for_writer_and_reader_alike(tmp_path):
    deepest = {"chain": nested_lists(62)}  # the outer object and "user" are two more levels: 64
    with varstore.Writer(tmp_path / "deep", metadata=deepest) as writer:
        writer.append(b"x")
    assert varstore.open(tmp_path / "deep").metadata == deepest
    for too_deep in ({"chain": nested_lists(63)}, {"chain": nested_lists(100_000)}):
        with pytest.raises(varstore.FormatError, match="over the limit of 64|deeper than the limit of 64"):
            varstore.Writer(tmp_path / "too-deep", metadata=too_deep)


def _call_near_the_recursion_limit(work, headroom: int = 30):
    """Run `work` with only `headroom` frames left before RecursionError."""
    def descend(levels: int):
        return descend(levels - 1) if levels else work()

    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return descend(sys.getrecursionlimit() - depth - headroom)


def test_metadata_nested_a_million_deep_is_refused_without_recursing(tmp_path):
    path = forged_shard(tmp_path, b"[" * 1_000_000 + b"]" * 1_000_000)

    def open_it():
        with pytest.raises(varstore.FormatError, match="nest 1000000 deep, over the limit of 64"):
            varstore.open(path)

    _call_near_the_recursion_limit(open_it)


def _worst_case_metadata(size: int) -> bytes:
    """About `size` bytes of the costliest JSON (in CPython's memory per byte) that §1.4's rule accepts: a map of
    short keys to small integers (the costliest containers, empty arrays and maps, are refused beyond the
    allowance)."""
    head, tail = b'{"codec":{},"user":{"x":{', b"}}}"
    members = [b'"%x":0' % number for number in range(size // 8)]
    return head + b",".join(members) + tail


def traced_open(path: str) -> tuple[varstore.Reader, int, int]:
    """(reader, peak bytes allocated while opening, bytes still held once open)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader = varstore.open(path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return reader, peak - before, held - before


def test_open_shard_holds_no_parsed_metadata_and_parses_it_within_the_stated_bound(tmp_path):
    metadata = _worst_case_metadata(512 << 10)
    for name in ("big", "small"):
        (tmp_path / name).mkdir()
    big = forged_shard(tmp_path / "big", metadata)
    small = forged_shard(tmp_path / "small", b'{"codec":{},"user":{}}')
    big_reader, big_peak, big_held = traced_open(big)
    small_reader, _, small_held = traced_open(small)
    assert big_peak <= PARSE_FACTOR * len(metadata) + (1 << 20)
    assert big_held - small_held < 16 << 10, "an open shard must not keep its parsed metadata"
    assert len(big_reader.metadata["x"]) == metadata.count(b",")  # parsed on demand, from the map (one comma in the head)
    assert small_reader.metadata == {}
