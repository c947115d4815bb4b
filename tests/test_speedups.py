"""The C extension (varstore/_speedups.c) makes varstore faster, never different.

Its contract, tested here against the pure-Python twin of each routine: checksums equal the `crc32c`
package's; `msgpack_passes` answers True only for payloads `check_msgpack`'s Python walk accepts (and does
answer True for ordinary records, so the fast path is taken); a `RecordSlicer` read returns None (the
caller then takes its Python path, which raises the proper error) unless the record is in range and its
offsets sound, so readers with and without the extension return the same records and raise the same
errors; writers with and without it write the same bytes. Skipped where the extension was not built
(tests/test_pure_python.py runs the suite without it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import struct
import sys
import tempfile
from array import array
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

import varstore
import varstore.shard.reader as reader_module
from varstore.format import msgpack_bounds as msgpack_check
from varstore._native import speedups
from varstore.format.checksum import crc32c_of_each, crc32c_of_ranges
from varstore.format.codecs import ARRAY_EXT_TYPE, MsgpackCodec
from varstore.errors import ClosedError, CorruptRecordError
from varstore.format.msgpack_bounds import MAX_DEPTH, check_msgpack

pytestmark = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")


@contextlib.contextmanager
def extension_disabled() -> Iterator[None]:
    """Every varstore module that took the extension sees None instead, as with VARSTORE_NO_EXTENSION=1."""
    modules = [module for name, module in sorted(sys.modules.items())
               if name.startswith("varstore") and module is not None and getattr(module, "speedups", None) is speedups]
    assert {reader_module, msgpack_check, sys.modules["varstore.format.checksum"]} <= set(modules)
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(_patched(module))
        yield


@contextlib.contextmanager
def _patched(module: Any) -> Iterator[None]:
    module.speedups = None
    try:
        yield
    finally:
        module.speedups = speedups


def python_check_msgpack(payload: bytes, ext_type: int) -> None:
    """`check_msgpack`'s Python walk alone."""
    with _patched(msgpack_check):
        check_msgpack(payload, ext_type)


def python_accepts(payload: bytes, ext_type: int = ARRAY_EXT_TYPE) -> bool:
    try:
        python_check_msgpack(payload, ext_type)
    except ValueError:
        return False
    return True


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call did, comparable across readers: its value with every element's type, or its error's class and message."""
    try:
        value = call()
    except Exception as error:  # noqa: BLE001 - the class is compared
        return ("raised", type(error), str(error))
    if isinstance(value, list):
        return ("returned", [type(item) for item in value], value)
    return ("returned", type(value), value)


@contextlib.contextmanager
def reader_pair(path: str) -> Iterator[tuple[Any, Any]]:
    """The shard at `path` opened twice: with the extension's RecordSlicer, and without (the Python path)."""
    fast = varstore.open(path)
    with _patched(reader_module):
        slow = varstore.open(path)
    try:
        assert fast._slicer is not None and slow._slicer is None
        yield fast, slow
    finally:
        fast.close()
        slow.close()


def write_shard(path: str, codec: str, records: list[Any], **options: Any) -> str:
    with varstore.Writer(path, codec, **options) as writer:
        writer.extend(records)
    return path


# ---- CRC32C ------------------------------------------------------------------------------------------


def random_bytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


sizes = st.one_of(st.integers(0, 64), st.integers(0, 4096), st.integers(60_000, 110_000))


@given(seed=st.integers(0, 2**32), size=sizes, cuts=st.lists(st.floats(0, 1), max_size=12), shift=st.integers(0, 7))
def test_crc32c_ranges_equals_the_crc32c_package_on_every_range(seed, size, cuts, shift):
    data = random_bytes(seed, size + shift)
    view = memoryview(data)[shift:]  # starts at any alignment
    bounds = sorted(int(cut * size) for cut in cuts) or [0]  # repeats are empty ranges
    offsets = np.array(bounds, "<u8")
    got = np.frombuffer(speedups.crc32c_ranges(view, offsets), np.uint32)
    assert got.tolist() == [crc32c(view[start:end]) for start, end in zip(bounds, bounds[1:])]


@given(seed=st.integers(0, 2**32), size=st.integers(65_536, 200_000))
def test_crc32c_ranges_over_64_kib_releases_the_gil_and_stays_right(seed, size):
    data = random_bytes(seed, size)
    bounds = [0, 1, size // 2, size // 2, size - 3, size]
    got = np.frombuffer(speedups.crc32c_ranges(data, np.array(bounds, "<u8").tobytes()), np.uint32)
    assert got.tolist() == [crc32c(data[start:end]) for start, end in zip(bounds, bounds[1:])]


def test_crc32c_ranges_over_64_kib_runs_while_another_thread_does():
    import threading

    data = random_bytes(1, 8 << 20)
    bounds = np.arange(0, len(data) + 1, 1 << 16, dtype="<u8")
    expected = [crc32c(data[start:end]) for start, end in zip(bounds.tolist(), bounds[1:].tolist())]
    results: list[list[int]] = []
    threads = [threading.Thread(target=lambda: results.append(np.frombuffer(speedups.crc32c_ranges(data, bounds), np.uint32).tolist()))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [expected] * 4


@pytest.mark.parametrize(
    "offsets, message",
    [
        (b"", "at least one"),
        (b"\x00" * 7, "at least one"),
        (b"\x00" * 12, "at least one"),
        (b"\x00" * 17, "at least one"),
        (struct.pack("<3Q", 0, 5, 4), "below the one before it"),
        (struct.pack("<2Q", 6, 2), "below the one before it"),
        (struct.pack("<2Q", 0, 11), "past the 10 bytes"),
        (struct.pack("<2Q", 11, 11), "past the 10 bytes"),
        (struct.pack("<2Q", 0, 2**64 - 1), "past the 10 bytes"),
        (struct.pack("<3Q", 0, 2**64 - 1, 3), "below the one before it"),
    ],
    ids=["empty", "7 bytes", "12 bytes", "17 bytes", "decreasing", "decreasing from the start", "past the end",
         "empty range past the end", "2**64-1", "wrapping"],
)
def test_crc32c_ranges_refuses_bad_offsets_with_value_error(offsets, message):
    with pytest.raises(ValueError, match=message):
        speedups.crc32c_ranges(b"0123456789", offsets)


def test_crc32c_ranges_refuses_wrong_arguments_with_type_error():
    with pytest.raises(TypeError):
        speedups.crc32c_ranges(b"abc")
    with pytest.raises(TypeError):
        speedups.crc32c_ranges("abc", struct.pack("<2Q", 0, 1))
    with pytest.raises(TypeError):
        speedups.crc32c_ranges(b"abc", [0, 1])


@given(payloads=st.lists(st.one_of(st.binary(max_size=300), st.integers(0, 100_000)), max_size=20), shift=st.integers(0, 7))
def test_crc32c_each_equals_the_crc32c_package_for_every_kind_of_buffer(payloads, shift):
    buffers: list[Any] = []
    for k, item in enumerate(payloads):
        data = item if isinstance(item, bytes) else random_bytes(item, item)
        kind = k % 4
        buffers.append(data if kind == 0 else bytearray(data) if kind == 1
                       else memoryview(bytes(shift) + data)[shift:] if kind == 2 else np.frombuffer(data, np.uint8))
    got = array("I")
    got.frombytes(speedups.crc32c_each(buffers))
    assert got.tolist() == [crc32c(bytes(buffer)) for buffer in buffers]
    assert speedups.crc32c_each(tuple(buffers)) == got.tobytes()


def test_crc32c_each_refuses_what_is_not_bytes_like():
    with pytest.raises(TypeError):
        speedups.crc32c_each([b"ok", "text"])
    with pytest.raises(TypeError):
        speedups.crc32c_each(42)


@given(seed=st.integers(0, 2**32), size=sizes, shift=st.integers(0, 7))
def test_software_crc32c_equals_the_crc32c_package(seed, size, shift):
    data = memoryview(random_bytes(seed, size + shift))[shift:]
    assert speedups.software_crc32c(data) == crc32c(data)


def test_software_crc32c_known_answer():
    assert speedups.software_crc32c(b"123456789") == 0xE3069283  # spec/FORMAT.md's check value
    assert speedups.software_crc32c(b"") == 0
    assert speedups.HARDWARE_CRC32C in (0, 1)


@given(seed=st.integers(0, 2**32), size=st.integers(0, 5000), cuts=st.lists(st.integers(0, 5000), max_size=10))
def test_crc32c_of_ranges_and_of_each_agree_with_and_without_the_extension(seed, size, cuts):
    data = random_bytes(seed, size)
    offsets = np.array(sorted(min(cut, size) for cut in [0, *cuts]), np.uint64)
    payloads = [data[start:end] for start, end in zip(offsets.tolist(), offsets[1:].tolist())]
    fast = (crc32c_of_ranges(data, offsets).tolist(), crc32c_of_each(payloads).tolist())
    with extension_disabled():
        slow = (crc32c_of_ranges(data, offsets).tolist(), crc32c_of_each(payloads).tolist())
    assert fast == slow


def test_crc32c_of_ranges_takes_strided_offsets_as_the_python_path_does():
    offsets = np.array([0, 1, 2, 3, 4, 5], np.uint64)[::2]
    with extension_disabled():
        expected = crc32c_of_ranges(b"abcdef", offsets).tolist()
    assert crc32c_of_ranges(b"abcdef", offsets).tolist() == expected


# ---- msgpack_passes: sound (True only where the Python walk accepts), and taken for ordinary records -----


def int_encodings(value: int) -> list[bytes]:
    """Every msgpack encoding of the integer `value`."""
    found = []
    if 0 <= value < 0x80:
        found.append(bytes([value]))
    if -32 <= value < 0:
        found.append(struct.pack("b", value))
    for first, layout in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q"),
                          (0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")):
        try:
            found.append(bytes([first]) + struct.pack(layout, value))
        except struct.error:
            pass
    return found


def raw_encodings(body: bytes, fix_base: int | None, firsts: tuple[int, int, int]) -> list[bytes]:
    """Every encoding of a str (fix_base 0xA0) or bin body: fix form if short, then the 8/16/32-bit length forms."""
    found = [bytes([fix_base | len(body)]) + body] if fix_base is not None and len(body) < 32 else []
    for first, size in zip(firsts, (1, 2, 4)):
        if len(body) < 1 << (8 * size):
            found.append(bytes([first]) + len(body).to_bytes(size, "big") + body)
    return found


def str_encodings(body: bytes) -> list[bytes]:
    return raw_encodings(body, 0xA0, (0xD9, 0xDA, 0xDB))


def bin_encodings(body: bytes) -> list[bytes]:
    return raw_encodings(body, None, (0xC4, 0xC5, 0xC6))


def ext_encodings(code: int, body: bytes) -> list[bytes]:
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    found = [bytes([fixext[len(body)]]) + struct.pack("b", code) + body] if len(body) in fixext else []
    for first, size in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        found.append(bytes([first]) + len(body).to_bytes(size, "big") + struct.pack("b", code) + body)
    return found


def header_encodings(count: int, fix_base: int, first16: int) -> list[bytes]:
    found = [bytes([fix_base | count])] if count < 16 else []
    found.append(bytes([first16]) + count.to_bytes(2, "big"))
    found.append(bytes([first16 + 1]) + count.to_bytes(4, "big"))
    return found


def one_encoding(encodings: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.sampled_from(encodings)


INTS = [0, 1, 5, 31, 127, 128, 255, 256, 65535, 65536, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
        -1, -5, -32, -33, -128, -129, -32768, -40000, -(2**31) - 1, -(2**63)]
ints = st.sampled_from(INTS).flatmap(lambda value: one_encoding(int_encodings(value)))
short_text = st.one_of(st.sampled_from([b"", b"a", b"b", b"ab", b"\x05", "é".encode(), b"\xff"]), st.binary(max_size=40))
strs = short_text.flatmap(lambda body: one_encoding(str_encodings(body)))
bins = short_text.flatmap(lambda body: one_encoding(bin_encodings(body)))
ext_codes = st.sampled_from([1, 1, 1, -1, 0, 2, 127, -128])
exts = st.tuples(ext_codes, st.sampled_from([0, 1, 2, 3, 4, 8, 12, 16, 17])).flatmap(
    lambda pair: one_encoding(ext_encodings(pair[0], bytes(range(pair[1])))))
timestamps = st.sampled_from([b"\xd6\xff" + bytes(4), b"\xd7\xff" + bytes(8), b"\xc7\x0c\xff" + bytes(12)])
others = st.sampled_from([b"\xc0", b"\xc2", b"\xc3", b"\xc1", b"\xca" + bytes(4), b"\xcb" + bytes(8)])
scalars = st.one_of(ints, strs, bins, exts, timestamps, others)
keys = st.one_of(ints, ints, strs, strs, bins, st.sampled_from([b"\xc0", b"\xc1", b"\xc3", b"\xcb" + bytes(8), b"\x90", b"\x80"]))


def arrays_of(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(children, max_size=6).flatmap(
        lambda items: one_encoding(header_encodings(len(items), 0x90, 0xDC)).map(lambda header: header + b"".join(items)))


def maps_of(children: st.SearchStrategy[bytes], max_size: int = 6) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(keys, children), max_size=max_size).flatmap(
        lambda pairs: one_encoding(header_encodings(len(pairs), 0x80, 0xDE)).map(
            lambda header: header + b"".join(key + value for key, value in pairs)))


msgpack_objects = st.recursive(scalars, lambda children: st.one_of(arrays_of(children), maps_of(children)), max_leaves=40)
big_maps = maps_of(st.one_of(scalars, maps_of(scalars, 3)), max_size=40)


def mutated(payloads: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """`payloads`, then truncated, extended or with bytes replaced."""

    @st.composite
    def mutate(draw: Any) -> bytes:
        payload = bytearray(draw(payloads))
        for _ in range(draw(st.integers(0, 3))):
            action = draw(st.sampled_from(["replace", "truncate", "insert", "append"]))
            at = draw(st.integers(0, len(payload)))
            if action == "replace" and payload:
                payload[min(at, len(payload) - 1)] = draw(st.integers(0, 255))
            elif action == "truncate":
                del payload[at:]
            elif action == "insert":
                payload[at:at] = draw(st.binary(min_size=1, max_size=3))
            else:
                payload += draw(st.binary(min_size=1, max_size=3))
        return bytes(payload)

    return mutate()


plain_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=40), st.binary(max_size=40),
              st.builds(lambda n: np.arange(n, dtype=np.int32), st.integers(0, 5))),
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1)), children, max_size=6)),
    max_leaves=30,
)
records = st.dictionaries(st.text(max_size=12), plain_values, max_size=32)


def assert_sound(payload: bytes, ext_type: int = ARRAY_EXT_TYPE) -> None:
    if speedups.msgpack_passes(payload, ext_type):
        python_check_msgpack(payload, ext_type)  # must not raise


@given(payload=st.one_of(msgpack_objects, big_maps, mutated(msgpack_objects), mutated(big_maps), st.binary(max_size=60)),
       ext_type=st.sampled_from([ARRAY_EXT_TYPE, -1, 0]))
def test_msgpack_passes_only_what_the_python_check_accepts(payload, ext_type):
    assert_sound(payload, ext_type)


@given(record=records)
def test_msgpack_passes_ordinary_records_so_the_fast_path_is_taken(record):
    payload = MsgpackCodec().encode(record)
    assert speedups.msgpack_passes(payload, ARRAY_EXT_TYPE)
    python_check_msgpack(payload, ARRAY_EXT_TYPE)


@given(record=records, data=st.data())
def test_msgpack_passes_is_sound_on_damaged_records(record, data):
    payload = MsgpackCodec().encode(record)
    assert_sound(data.draw(mutated(st.just(payload))))


@pytest.mark.parametrize("value", [5, 0, 127, -1, -32, 200, -100, 40000, 2**40, -(2**40), 2**64 - 1, -(2**63)])
def test_msgpack_passes_refuses_an_integer_key_repeated_in_another_width(value):
    encodings = int_encodings(value)
    assert encodings  # -(2**40), 2**64-1 and -(2**63) have one width: the same key twice
    for first in encodings:
        for second in encodings:
            payload = b"\x82" + first + b"\xc0" + second + b"\xc0"
            assert not speedups.msgpack_passes(payload, 1), payload.hex()
            assert not python_accepts(payload)


@pytest.mark.parametrize("body", [b"", b"k", b"key", b"\x05", "é".encode(), b"a" * 31, b"a" * 40])
def test_msgpack_passes_refuses_a_str_key_repeated_in_another_width(body):
    for first in str_encodings(body):
        for second in str_encodings(body):
            payload = b"\x82" + first + b"\xc0" + second + b"\xc0"
            assert not speedups.msgpack_passes(payload, 1), payload.hex()
            assert not python_accepts(payload)


@pytest.mark.parametrize(
    "first, second",
    [(b"\x05", b"\xa1\x05"), (b"\xcf" + b"\xff" * 8, b"\xd3" + b"\xff" * 8), (b"\xff", b"\xcc\xff"),
     (b"\xd0\x80", b"\xcc\x80"), (b"\xa1a", b"\xa1b"), (b"\xa2ab", b"\xa1a")],
    ids=["5 and '\\x05'", "2**64-1 and -1", "-1 and 255", "-128 and 128", "'a' and 'b'", "'ab' and 'a'"],
)
def test_msgpack_passes_accepts_distinct_keys_that_share_bytes(first, second):
    payload = b"\x82" + first + b"\xc0" + second + b"\xc0"
    assert speedups.msgpack_passes(payload, 1)
    assert python_accepts(payload)


@pytest.mark.parametrize(
    "payload",
    [b"\x81\xc4\x01k\xc0", b"\x81\xc0\xc0", b"\x81\xcb" + bytes(8) + b"\xc0", b"\x81\x90\xc0", b"\x81\xc1\xc0",
     b"\xd4\x02\x00", b"\xd6\xff" + bytes(4), b"\xc7\x0c\xff" + bytes(12), b"\xc1", b"\x91\xc1", b"", b"\xc0\xc0",
     b"\x92\xc0", b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff\xc0", b"\xd9\x05ab", b"\x81\xd9\x05ab", b"\x81\xcc"],
    ids=["bin key", "nil key", "float key", "array key", "0xc1 key", "ext 2", "timestamp 32", "timestamp 96", "0xc1",
         "0xc1 in array", "empty", "two objects", "missing element", "array 16 claims too many",
         "array 32 claims too many", "str truncated", "str key truncated", "int key truncated"],
)
def test_msgpack_passes_refuses_what_the_python_check_refuses(payload):
    assert not speedups.msgpack_passes(payload, 1)
    assert not python_accepts(payload)


def test_msgpack_passes_accepts_the_allowed_extension_type_only():
    timestamp = b"\xd6\xff" + bytes(4)
    assert speedups.msgpack_passes(timestamp, -1) and python_accepts(timestamp, -1)
    for code in (-128, 0, 2, 127):
        for payload in ext_encodings(code, b"\x00" * 4):
            assert speedups.msgpack_passes(payload, code) and python_accepts(payload, code)
            assert not speedups.msgpack_passes(payload, 1) and not python_accepts(payload, 1)


@pytest.mark.parametrize("depth", [1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2, 2 * MAX_DEPTH])
@pytest.mark.parametrize("container", [b"\x91", b"\x81\x00", b"\xdc\x00\x01", b"\xdf\x00\x00\x00\x01\xa1k", b"\x82\x00\xc0\x01"])
def test_msgpack_passes_agrees_on_nesting_up_to_and_beyond_the_deepest(depth, container):
    payload = container * depth + b"\xc0"
    accepted = python_accepts(payload)
    assert accepted == (depth <= MAX_DEPTH)
    assert speedups.msgpack_passes(payload, 1) == accepted


@pytest.mark.parametrize("count", [0, 1, 16, 31, 32, 33, 40, 1000])
def test_msgpack_passes_declines_maps_over_32_keys_which_the_python_check_decides(count):
    payload = MsgpackCodec().encode({f"k{k}": k for k in range(count)})
    assert python_accepts(payload)
    assert speedups.msgpack_passes(payload, 1) == (count <= 32)


def test_msgpack_passes_declines_more_keys_than_its_key_stack_holds():
    inner = {f"k{k}": k for k in range(31)}
    record: Any = inner
    for _ in range(40):  # 40 nested maps of 32 keys each, "next" last: 1,280 keys open at once at the deepest
        record = {**inner, "next": record}
    payload = MsgpackCodec().encode(record)
    assert python_accepts(payload)
    assert not speedups.msgpack_passes(payload, 1)
    assert_sound(payload)


def test_msgpack_passes_refuses_wrong_arguments():
    with pytest.raises(ValueError, match="extension type"):
        speedups.msgpack_passes(b"\xc0", 128)
    with pytest.raises(ValueError, match="extension type"):
        speedups.msgpack_passes(b"\xc0", -129)
    with pytest.raises(TypeError):
        speedups.msgpack_passes(b"\xc0")
    with pytest.raises(TypeError):
        speedups.msgpack_passes("text", 1)
    with pytest.raises(OverflowError):
        speedups.msgpack_passes(b"\xc0", 2**70)


def test_check_msgpack_raises_the_python_message_where_the_extension_declines():
    payload = b"\x82\xa1k\xc0\xd9\x01k\xc0"
    with pytest.raises(ValueError) as fast:
        check_msgpack(payload, 1)
    with pytest.raises(ValueError) as slow:
        python_check_msgpack(payload, 1)
    assert str(fast.value) == str(slow.value) == "the map key at byte 4 repeats an earlier key of its map"


# ---- RecordSlicer, directly: the record or None, never a crash -----------------------------------------


def expected_slice(data: bytes, offsets: list[int], position: int, as_str: bool) -> Any:
    count = len(offsets) - 1
    if position < 0:
        position += count
    if not 0 <= position < count:
        return None
    start, end = offsets[position], offsets[position + 1]
    if not start <= end <= len(data):
        return None
    record = data[start:end]
    if not as_str:
        return record
    try:
        return record.decode("utf-8")
    except UnicodeDecodeError:
        return None


offsets_values = st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1]))


@given(data=st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)), offsets=st.lists(offsets_values, min_size=1, max_size=10),
       pad=st.integers(0, 20), spare=st.integers(0, 9), as_str=st.booleans())
def test_record_slicer_returns_the_record_or_none_for_any_offsets(data, offsets, pad, spare, as_str):
    index = bytes(pad) + np.array(offsets, "<u8").tobytes() + bytes(spare)
    count = len(offsets) - 1
    slicer = speedups.RecordSlicer(index, pad, count, data, as_str)
    expected = {position: expected_slice(data, offsets, position, as_str) for position in range(-count - 2, count + 2)}
    for position, record in expected.items():
        assert slicer.get(position) == record
    for positions in (list(range(count)), list(range(-count, 0)), [count], [-count - 1], [0, 0] if count else []):
        records = [expected[position] for position in positions]
        assert slicer.get_batch(positions) == (None if None in records else records)
        assert slicer.get_batch(tuple(positions)) == slicer.get_batch(np.array(positions, np.int64))
    for other in (True, 0.0, "0", None, np.int64(0), slice(0, 1), 2**63, -(2**63) - 1, 2**100):
        assert slicer.get(other) is None
    for other in ([True], [0.0], np.array([0], np.int32), np.array([0], np.uint64), np.array([2**64 - 1], np.uint64), np.array([[0]], np.int64),
                  np.array([0, 0], np.int64)[::2], np.array([0], ">i8"), b"\x00" * 8, "0", 7, [2**63], range(count)):
        assert slicer.get_batch(other) is None
    slicer.release()
    assert slicer.get(0) is None and slicer.get_batch([]) is None


def test_record_slicer_refuses_an_index_too_small_or_negative_bounds():
    with pytest.raises(ValueError, match="no room"):
        speedups.RecordSlicer(bytes(16), 0, 2, b"", False)
    with pytest.raises(ValueError, match="no room"):
        speedups.RecordSlicer(bytes(16), 24, 0, b"", False)
    with pytest.raises(ValueError, match="no room"):
        speedups.RecordSlicer(bytes(16), 9, 0, b"", False)
    with pytest.raises(ValueError, match="negative"):
        speedups.RecordSlicer(bytes(16), -8, 0, b"", False)
    with pytest.raises(ValueError, match="negative"):
        speedups.RecordSlicer(bytes(16), 0, -1, b"", False)
    with pytest.raises(TypeError):
        speedups.RecordSlicer("index", 0, 0, b"", False)
    assert speedups.RecordSlicer(bytes(8), 0, 0, b"", False).get_batch([]) == []


def test_record_slicer_release_lets_the_maps_close(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(struct.pack("<2Q", 0, 3) + b"abc")
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    slicer = speedups.RecordSlicer(mapped, 0, 1, memoryview(mapped)[16:], False)
    assert slicer.get(0) == b"abc"
    with pytest.raises(BufferError):
        mapped.close()  # the slicer holds views of it
    slicer.release()
    slicer.release()  # twice is harmless
    mapped.close()  # no BufferError
    assert slicer.get(0) is None and slicer.get_batch([0]) is None


# ---- Reader: the same records and errors with and without the extension ---------------------------------


def single_indices(count: int) -> list[Any]:
    return [*range(-count - 2, count + 2), np.int64(0), np.int64(-1), np.int32(count), np.uint64(count - 1 if count else 0),
            True, False, np.bool_(True), slice(None), slice(1, -1), slice(None, None, 2), slice(None, None, -1),
            0.0, "0", None, 2**63, -(2**63) - 1, 2**100]


def batch_indices(count: int) -> list[Any]:
    every = list(range(count))
    return [every, tuple(every), every[::-1], [-1, 0, -1] if count else [], [], (), np.zeros(0, np.int64),
            np.array(every, np.int64), np.array(every, np.int32), np.array(every, np.uint64), np.array(every, ">i8"),
            np.array(every, np.int64)[::2], array("q", every), np.array([2**64 - 1], np.uint64), array("Q", [2**64 - 1]),
            [count], [-count - 1], [0, count] if count else [count],
            np.array([count], np.int64), np.array([-count - 1], np.int64), [2**63], [True, False], [0.0], ["0"],
            np.array([[0]] if count else [[]], np.int64), range(count), 5, None]


def assert_readers_agree(fast: Any, slow: Any) -> None:
    count = len(slow)
    assert len(fast) == count
    for index in single_indices(count):
        assert outcome(lambda: fast[index]) == outcome(lambda: slow[index]), repr(index)
    for indices in batch_indices(count):
        assert outcome(lambda: fast.get_batch(indices)) == outcome(lambda: slow.get_batch(indices)), repr(indices)


shard_contents = st.one_of(
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=300), max_size=30)),
    st.tuples(st.just("str"), st.lists(st.text(max_size=100), max_size=30)),
)


@given(contents=shard_contents, checksums=st.booleans())
def test_reader_gives_the_same_records_and_errors_with_and_without_the_extension(contents, checksums):
    codec, items = contents
    with tempfile.TemporaryDirectory() as directory:
        path = write_shard(os.path.join(directory, "shard"), codec, items, checksums=checksums)
        with reader_pair(path) as (fast, slow):
            if items:
                assert fast._fast_get(0) == items[0] and fast._fast_batch([0]) == [items[0]]  # the fast path is taken
            assert [fast[k] for k in range(len(items))] == items
            assert fast.get_batch(np.arange(len(items))) == items
            assert_readers_agree(fast, slow)


def test_reader_with_verify_reads_or_other_codecs_has_no_slicer(tmp_path):
    path = write_shard(str(tmp_path / "bytes"), "bytes", [b"a"])
    with varstore.open(path, verify_reads=True) as reader:
        assert reader._slicer is None and reader[0] == b"a"
    for codec, items, options in (("msgpack", [{"a": 1}], {}), ("ndarray", [np.arange(3, dtype=np.uint16)], {"dtype": "uint16"})):
        path = write_shard(str(tmp_path / codec), codec, items, **options)
        with varstore.open(path) as reader:
            assert reader._slicer is None


def offsets_start_of(path: str) -> int:
    with varstore.open(path) as reader:
        return reader.header.offsets_start


def patch_offset(path: str, position: int, value: int) -> None:
    """Overwrite offsets[position] in the shard's .index file (spec/FORMAT.md §1.1; open checks only the first and last)."""
    start = offsets_start_of(path)
    with open(path + ".index", "r+b") as file:
        file.seek(start + 8 * position)
        file.write(struct.pack("<Q", value))


@pytest.mark.parametrize("codec", ["bytes", "str"])
@pytest.mark.parametrize(
    "position, value, damaged",
    [(1, 10**6, {0, 1}), (2, 2**64 - 1, {1, 2}), (2, 2**63, {1, 2}), (3, 1, {2}), (2, 0, {1}), (4, 36, {3, 4})],
    ids=["beyond the data file", "2**64-1", "2**63", "decreasing", "back to zero", "one past the end"],
)
def test_reader_with_forged_offsets_raises_what_the_python_path_raises(tmp_path, codec, position, value, damaged):
    items = [f"record{k}" for k in range(5)]  # 7 bytes each: data is 35 bytes, offsets 0, 7, ... 35
    path = write_shard(str(tmp_path / "shard"), codec, [item.encode() for item in items] if codec == "bytes" else items)
    patch_offset(path, position, value)
    with reader_pair(path) as (fast, slow):
        for record in range(5):
            if record in damaged:
                with pytest.raises(CorruptRecordError, match=f"record {record} has offsets"):
                    fast[record]
            else:
                assert fast[record] == slow[record]
        assert_readers_agree(fast, slow)
        assert outcome(fast.verify) == outcome(slow.verify)
        assert outcome(lambda: list(fast)) == outcome(lambda: list(slow))
        assert outcome(fast.record_sizes) == outcome(slow.record_sizes)


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"],
                         ids=["0xff", "truncated 2-byte", "surrogate", "truncated 3-byte", "above U+10FFFF"])
def test_str_shard_with_invalid_utf8_raises_what_the_python_path_raises(tmp_path, bad):
    items = [f"{k:04d}" + "x" * 196 for k in range(100)]  # 20 KB: byte 10,000 lies outside the edges open checks
    path = write_shard(str(tmp_path / "shard"), "str", items)
    with open(path + ".data", "r+b") as file:
        file.seek(10_010)
        file.write(bad)
    with reader_pair(path) as (fast, slow):
        with pytest.raises(CorruptRecordError, match="record 50 does not decode as str"):
            fast[50]
        assert fast[49] == items[49] and fast[51] == items[51]
        assert outcome(lambda: fast[50]) == outcome(lambda: slow[50])
        assert outcome(lambda: fast[-50]) == outcome(lambda: slow[-50])
        for indices in ([49, 50, 51], np.array([50], np.int64), (50,), list(range(100))):
            assert outcome(lambda: fast.get_batch(indices)) == outcome(lambda: slow.get_batch(indices))
        assert outcome(lambda: fast.get_batch([49, 51])) == ("returned", [str, str], [items[49], items[51]])


@pytest.mark.parametrize("codec", ["bytes", "str"])
def test_reads_after_close_raise_closed_error(tmp_path, codec):
    path = write_shard(str(tmp_path / "shard"), codec, [b"ab", b"c"] if codec == "bytes" else ["ab", "c"])
    with reader_pair(path) as (fast, slow):
        fast.close()
        slow.close()
        for read in (lambda reader: reader[0], lambda reader: reader[-1], lambda reader: reader.get_batch([0, 1]),
                     lambda reader: reader.get_batch(np.array([0], np.int64)), lambda reader: reader[np.int64(0)]):
            with pytest.raises(ClosedError):
                read(fast)
            assert outcome(lambda: read(fast)) == outcome(lambda: read(slow))
        assert fast._slicer is None


def test_close_releases_the_slicer_so_the_data_map_closes(tmp_path):
    path = write_shard(str(tmp_path / "shard"), "bytes", [b"a" * 100] * 10)
    reader = varstore.open(path)
    slicer = reader._slicer
    data_map, index_map = reader._data_map, reader._index_map
    assert reader[3] == b"a" * 100 and reader.get_batch([1, 2]) == [b"a" * 100] * 2
    reader.close()  # no BufferError
    assert data_map.closed and index_map.closed
    assert slicer.get(0) is None


# ---- Writer: the same bytes with and without the extension ---------------------------------------------


writer_contents = st.one_of(
    st.tuples(st.just("bytes"), st.just({}), st.lists(st.binary(max_size=2000), max_size=40)),
    st.tuples(st.just("str"), st.just({}), st.lists(st.text(max_size=200), max_size=40)),
    st.tuples(st.just("ndarray"), st.just({"dtype": "uint16"}),
              st.lists(st.integers(0, 300).map(lambda n: np.arange(n, dtype=np.uint16)), max_size=20)),
    st.tuples(st.just("ndarray"), st.just({"dtype": "float32", "shape": [2]}),
              st.lists(st.integers(0, 50).map(lambda n: np.ones((n, 2), np.float32) * n), max_size=20)),
    st.tuples(st.just("msgpack"), st.just({}), st.lists(records, max_size=10)),
)


def shard_bytes(path: str) -> tuple[bytes, bytes]:
    with open(path + ".data", "rb") as data, open(path + ".index", "rb") as index:
        return data.read(), index.read()


@given(contents=writer_contents, checksums=st.booleans(), large=st.integers(0, 3))
def test_writer_writes_the_same_bytes_with_and_without_the_extension(contents, checksums, large):
    codec, options, items = contents
    if codec == "bytes":
        items = items + [random_bytes(size, size) for size in (100_000, 70_000, 1 << 20)[:large]]  # past the buffer
    with tempfile.TemporaryDirectory() as directory:
        fast = write_shard(os.path.join(directory, "fast"), codec, items, checksums=checksums, **options)
        with extension_disabled():
            slow = write_shard(os.path.join(directory, "slow"), codec, items, checksums=checksums, **options)
        assert shard_bytes(fast) == shard_bytes(slow)


@given(lengths=st.lists(st.integers(0, 3000), max_size=30), seed=st.integers(0, 2**32), ndarray=st.booleans())
def test_writer_extend_flat_writes_the_same_bytes_with_and_without_the_extension(lengths, seed, ndarray):
    options = {"dtype": "uint16"} if ndarray else {}
    total = sum(lengths)
    values: Any = (np.frombuffer(random_bytes(seed, 2 * total), np.uint16) if ndarray else random_bytes(seed, total))

    def write(path: str) -> str:
        with varstore.Writer(path, "ndarray" if ndarray else "bytes", **options) as writer:
            writer.append(values[:1])
            writer.extend_flat(values, lengths)
            writer.extend_flat(values, lengths)
        return path

    with tempfile.TemporaryDirectory() as directory:
        fast = write(os.path.join(directory, "fast"))
        with extension_disabled():
            slow = write(os.path.join(directory, "slow"))
        assert shard_bytes(fast) == shard_bytes(slow)
        with varstore.open(fast) as reader:
            reader.verify()


def test_verify_finds_the_same_damaged_records_with_and_without_the_extension(tmp_path):
    items = [bytes([k]) * (50 + k) for k in range(200)]
    path = write_shard(str(tmp_path / "shard"), "bytes", items)
    with open(path + ".data", "r+b") as file:
        for position in (5_000, 9_000, 12_000):
            file.seek(position)
            file.write(b"\xaa")
    with reader_pair(path) as (fast, slow):
        with pytest.raises(CorruptRecordError) as raised:
            fast.verify()
        assert len(raised.value.records) == 3
        assert outcome(fast.verify) == outcome(slow.verify)
