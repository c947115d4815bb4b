"""The C extension's verification of a chunk of records (`speedups.verify_checksums`) gives what the Python path
gives: the data CRC continued over the chunk and the records whose checksum is wrong, for any cuts of the chunk
(records of every length class the C code treats apart: short ones three at a time, long ones on three streams),
any alignment and any wrong checksums; and refuses offsets that are not the chunk's. The three-stream CRC itself
equals the `crc32c` package's around every block boundary. Skipped where the extension was not built."""

from __future__ import annotations

import random

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

import varstore
import varstore.shard.index as index_module
from varstore._native import speedups
from varstore.errors import CorruptRecordError
from varstore.format.checksum import crc32c_of_ranges

from .test_speedups import extension_disabled

pytestmark = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")


def python_verify(data: bytes, offsets: np.ndarray, checksums: np.ndarray | None, crc: int) -> tuple[int, list[int]]:
    """The Python path of `index._checksummed`: the crc32c package and per-record CRCs compared with numpy."""
    relative = (offsets - offsets[0]).astype(np.int64)
    wrong = [] if checksums is None else np.flatnonzero(crc32c_of_ranges(data, relative) != checksums).tolist()
    return crc32c(data, crc), wrong


# Lengths around the C code's thresholds: words and 4/2/1-byte tails, three short records side by side, and past
# 3 x 256 bytes, where a record is checksummed alone on three streams.
record_lengths = st.one_of(st.integers(0, 24), st.integers(0, 300), st.integers(760, 800), st.integers(3000, 30_000))


@given(lengths=st.lists(record_lengths, max_size=420), seed=st.integers(0, 2**32), shift=st.integers(0, 7),
       base=st.integers(0, 2**40), wrong=st.sets(st.integers(0, 419), max_size=6), crc=st.integers(0, 2**32 - 1),
       checksums=st.booleans())
def test_verify_checksums_agrees_with_the_python_path(lengths, seed, shift, base, wrong, crc, checksums):
    rng = random.Random(seed)
    data = rng.randbytes(shift + sum(lengths))[shift:]
    offsets = (base + np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])).astype("<u8")
    stored = None
    if checksums:
        stored = crc32c_of_ranges(data, (offsets - offsets[0]).astype(np.int64)).astype("<u4")
        for position in wrong:
            if position < len(stored):
                stored[position] ^= 1 << rng.randrange(32)
    found = speedups.verify_checksums(memoryview(bytes(shift) + data)[shift:], offsets, stored, crc)
    assert found == python_verify(data, offsets, stored, crc)
    if checksums:
        assert found[1] == sorted(position for position in wrong if position < len(lengths))


def test_verify_checksums_finds_a_flipped_byte_in_every_record_of_a_group():
    lengths = [7, 8, 9, 100, 101, 102, 5000, 1, 0, 300] * 30  # past one group of 192 records
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
    data = bytearray(random.Random(1).randbytes(int(offsets[-1])))
    stored = crc32c_of_ranges(bytes(data), offsets.astype(np.int64)).astype("<u4")
    damaged = [k for k, length in enumerate(lengths) if length]
    for k in damaged:
        data[int(offsets[k]) + lengths[k] - 1] ^= 0x80  # the last byte: a record's tail
    assert speedups.verify_checksums(data, offsets, stored, 0)[1] == damaged


@pytest.mark.parametrize("offsets, checksums, message", [
    ([0, 5, 3, 10], 3, "offset 2 is below the one before it"),
    ([0, 5, 9], 2, "offsets span 9 bytes but data holds 10"),
    ([0, 5, 10], 1, "2 records need 8 bytes of checksums, got 4"),
    ([], 0, "offsets must be at least one little-endian uint64"),
])
def test_verify_checksums_refuses_offsets_that_are_not_the_chunks(offsets, checksums, message):
    with pytest.raises(ValueError, match=message):
        speedups.verify_checksums(bytes(10), np.asarray(offsets, "<u8"), np.zeros(checksums, "<u4"), 0)


def test_verify_checksums_refuses_wrong_arguments():
    with pytest.raises(TypeError):
        speedups.verify_checksums(bytes(1), np.zeros(2, "<u8"), None)
    with pytest.raises(ValueError):
        speedups.verify_checksums(bytes(0), np.zeros(1, "<u8"), None, 2**32)


@pytest.mark.parametrize("size", [767, 768, 769, 3 * 256 + 7, 24_575, 24_576, 24_577, 3 * 8192 + 3 * 256 + 9, 200_003])
@pytest.mark.parametrize("shift", [0, 1, 7])
def test_three_stream_crc_equals_the_crc32c_package_around_its_blocks(size, shift):
    data = random.Random(size).randbytes(size + shift)[shift:]
    assert speedups.verify_checksums(data, np.asarray([0, size], "<u8"), None, 0)[0] == crc32c(data)
    assert speedups.software_crc32c(data) == crc32c(data)


def test_shard_verify_lists_the_same_damage_with_and_without_the_extension(tmp_path):
    lengths = [random.Random(k).randrange(0, 400) for k in range(20_000)]
    records = [bytes([k % 251]) * length for k, length in enumerate(lengths)]
    path = str(tmp_path / "shard")
    with varstore.Writer(path) as writer:
        writer.extend(records)
    ends = np.cumsum(lengths)
    damaged = [k for k in (300, 7_001, 7_002, 19_000) if lengths[k]]
    with open(path + ".data", "r+b") as file:
        for k in damaged:
            file.seek(int(ends[k]) - 1)
            file.write(b"\xff")
    with varstore.open(path) as reader:
        with pytest.raises(CorruptRecordError) as fast:
            reader.verify()
        with extension_disabled():
            assert index_module.speedups is None
            with pytest.raises(CorruptRecordError) as slow:
                reader.verify()
    assert fast.value.records == slow.value.records == damaged
    assert str(fast.value) == str(slow.value)
