"""The C extension's single reads of compressed ``bytes`` and ``str`` records: `speedups.FrameSlicer` (2.x, a frame
per record) and `speedups.BlockSlicer` (3.x, blocks of records).

It reads a record only when the Python path would return the same value, and declines (None) otherwise, so that
the Python path decides and words the error: out of range, offsets unsound, a frame `check_frame` refuses, a frame
that does not decode, text that is not UTF-8, a released slicer, and any thread but the one that made it (zstd
contexts are not thread-safe). Compared here against the Python path on shards of each compression, on damaged
frames, and from other threads.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore._native import speedups
from varstore.errors import CorruptRecordError
from varstore.format import header as fmt
from varstore.format.checksum import crc32c

from .helpers_reliability import rewrite_header

zstandard = pytest.importorskip("zstandard")
pytestmark = pytest.mark.skipif(speedups is None, reason="varstore._speedups was not built (or VARSTORE_NO_EXTENSION is set)")

TEXTS = [f"record {k}: " + "the frame of a shard " * (k % 9) + "é" * (k % 3) for k in range(300)]


def write(path, records, codec="bytes", compression="zstd-dict"):
    with varstore.Writer(path, codec=codec, compression=compression) as writer:
        for record in records:
            writer.append(record)
    return path


def forge_data(path, data: bytes) -> None:
    """Replace the shard's data file with `data`, its header's data and edge CRC32C made right again, so that only
    the forged frame is wrong."""
    index = Path(f"{path}.index").read_bytes()
    edges = (data[offset : offset + length] for offset, length in fmt.edge_ranges(len(data)))
    Path(f"{path}.index").write_bytes(rewrite_header(index, data_crc32c=crc32c(data), data_edge_crc32c=fmt.edge_crc32c(*edges)))
    Path(f"{path}.data").write_bytes(data)


def python_read(reader, index):
    """The read with the C path set aside."""
    saved, reader._fast_get = reader._fast_get, None
    try:
        return reader[index]
    finally:
        reader._fast_get = saved


SLICERS = {"zstd": "FrameSlicer", "zstd-dict": "FrameSlicer", "zstd-blocks": "BlockSlicer", "zstd-dict-blocks": "BlockSlicer"}


@pytest.mark.parametrize("compression", list(SLICERS))
@pytest.mark.parametrize("codec", ["bytes", "str"])
def test_the_c_path_reads_every_record_as_the_python_path_does(tmp_path, codec, compression):
    records = TEXTS * 20 if codec == "str" else [text.encode() for text in TEXTS * 20]
    with varstore.open(write(tmp_path / "s", records, codec, compression)) as reader:
        assert type(reader._slicer).__name__ == SLICERS[compression]
        for index in [*range(len(records)), -1, -len(records)]:
            record = reader._slicer.get(index)
            assert record == records[index] == python_read(reader, index)
            assert type(record) is type(records[index])


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=40), st.sampled_from(list(SLICERS)))
def test_reads_equal_the_records_written_whatever_their_bytes(tmp_path_factory, records, compression):
    path = write(tmp_path_factory.mktemp("h") / "s", records, compression=compression)
    with varstore.open(path) as reader:
        assert [reader[k] for k in range(len(records))] == records


def test_it_declines_what_is_out_of_range_or_no_int(tmp_path):
    with varstore.open(write(tmp_path / "s", [b"a", b"b"])) as reader:
        for index in (2, -3, 1 << 70, True, 1.0, "1"):
            assert reader._slicer.get(index) is None


def test_a_damaged_frame_is_declined_and_refused_by_the_python_path_by_name(tmp_path):
    records = [text.encode() for text in TEXTS]
    path = write(tmp_path / "s", records, compression="zstd")
    with varstore.open(path) as reader:
        start, end = (int(value) for value in reader._index.offsets[7:9])
    data = bytearray((tmp_path / "s.data").read_bytes())
    data[start + 4] ^= 0x40  # the frame header's descriptor: the declared content size no longer agrees
    forge_data(path, bytes(data))
    with varstore.open(path) as reader:
        assert reader._slicer.get(7) is None
        with pytest.raises(CorruptRecordError, match="record 7"):
            reader[7]
        assert reader[8] == records[8]


def test_a_frame_that_passes_the_check_but_does_not_decode_is_declined(tmp_path):
    records = [b"x" * 500 + bytes(range(256)) * 4]
    path = write(tmp_path / "s", records, compression="zstd")
    data = bytearray((tmp_path / "s.data").read_bytes())
    data[-3] ^= 0xFF  # inside the last block's compressed bytes: the header still passes, decoding fails
    forge_data(path, bytes(data))
    with varstore.open(path) as reader:
        assert reader._slicer.get(0) is None
        with pytest.raises(CorruptRecordError, match="record 0"):
            reader[0]


def test_text_that_is_not_utf8_is_declined_and_refused(tmp_path):
    path = write(tmp_path / "s", ["ok", "ü"], codec="str", compression="zstd")
    raw = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(b"\xff\xfe")
    with varstore.open(path) as reader:
        start, end = (int(value) for value in reader._index.offsets[1:3])
    assert end - start == len(raw) and reader is not None  # both payloads are 2 bytes: the forged frame fits exactly
    data = bytearray((tmp_path / "s.data").read_bytes())
    data[start:end] = raw
    forge_data(path, bytes(data))
    with varstore.open(path) as reader:
        assert reader._slicer.get(1) is None
        with pytest.raises(CorruptRecordError, match="record 1"):
            reader[1]


def test_other_threads_are_declined_and_read_through_the_python_path(tmp_path):
    records = [text.encode() for text in TEXTS]
    with varstore.open(write(tmp_path / "s", records)) as reader:
        barrier = threading.Barrier(3, timeout=120)

        def read(seed: int):
            barrier.wait()
            order = random.Random(seed).sample(range(len(records)), len(records))
            return reader._slicer.get(0), [reader[k] for k in order] == [records[k] for k in order]

        with ThreadPoolExecutor(max_workers=3) as pool:
            results = list(pool.map(read, range(3)))
        assert results == [(None, True)] * 3
        assert reader._slicer.get(0) == records[0]  # the thread that opened it keeps the C path


def test_a_closed_reader_declines(tmp_path):
    reader = varstore.open(write(tmp_path / "s", [b"a"]))
    slicer = reader._slicer
    reader.close()
    assert slicer.get(0) is None


def test_a_frame_declaring_more_than_its_record_is_declined_before_anything_is_allocated(tmp_path):
    import tracemalloc

    import numpy as np

    from .helpers_reliability import reseal_body

    path = write(tmp_path / "s", [b"0123456789"], compression="zstd")
    bomb = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(bytes(64 << 20))
    index = bytearray(Path(f"{path}.index").read_bytes())
    with varstore.open(path) as reader:
        offsets_start = reader.header.offsets_start
    np.frombuffer(index, "<u8", 2, offsets_start)[1] = len(bomb)
    Path(f"{path}.index").write_bytes(rewrite_header(reseal_body(bytes(index)), data_size=len(bomb)))
    forge_data(path, bomb)
    with varstore.open(path) as reader:
        tracemalloc.start()
        try:
            assert reader._slicer.get(0) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20  # the 64 MiB the frame declares were never allocated
        with pytest.raises(CorruptRecordError, match="record 0"):
            reader[0]


# -- blocks (3.x) ----------------------------------------------------------------------------------------------


def block_slicer(reader, decompress):
    """A BlockSlicer over `reader`'s shard whose zstd calls go through `decompress`."""
    blocks = reader._index.blocks
    return speedups.BlockSlicer(blocks.offsets, blocks.block_offsets, blocks.block_records, blocks.block_checksums,
                                reader._data_map, False, blocks.decompressor.dictionary_id, decompress)


def test_reading_records_in_order_decodes_each_block_once(tmp_path):
    records = [text.encode() for text in TEXTS * 20]
    with varstore.open(write(tmp_path / "s", records, compression="zstd-blocks")) as reader:
        context = reader._index.blocks.decompressor.thread_decompress()
        calls = []
        slicer = block_slicer(reader, lambda frame, size: calls.append(size) or context(frame, size))
        assert [slicer.get(k) for k in range(len(records))] == records
        assert len(calls) == reader._index.blocks.count > 1
        assert slicer.get(0) == records[0] and len(calls) == reader._index.blocks.count + 1
        slicer.release()


def test_a_block_whose_checksum_is_wrong_is_declined_and_its_records_refused(tmp_path):
    generator = random.Random(5)
    records = [generator.randbytes(700) for _ in range(60)]  # incompressible: raw zstd blocks, so a flipped byte decodes
    path = write(tmp_path / "s", records, compression="zstd-blocks")
    with varstore.open(path) as reader:
        blocks = reader._index.blocks
        first, last = (int(value) for value in blocks.block_records[1:3])
        start = int(blocks.block_offsets[1])
    data = bytearray((tmp_path / "s.data").read_bytes())
    data[start + 20] ^= 1
    forge_data(path, bytes(data))
    with varstore.open(path) as reader:
        assert reader._slicer.get(first) is None and reader._slicer.get(last - 1) is None
        with pytest.raises(CorruptRecordError, match=f"record {first}: block 1 checksum"):
            reader[first]
        assert reader._slicer.get(last) == records[last] and reader[0] == records[0]


def test_a_block_table_that_does_not_bracket_the_record_is_declined(tmp_path):
    import numpy as np

    from .helpers_reliability import reseal_body

    records = [text.encode() for text in TEXTS * 20]
    path = write(tmp_path / "s", records, compression="zstd-blocks")
    with varstore.open(path) as reader:
        blocks = reader._index.blocks
        records_at = blocks._records_at
        hidden = int(blocks.block_records[2]) + 1
        count = blocks.count
    index = bytearray(Path(f"{path}.index").read_bytes())
    table = np.frombuffer(index, "<u8", count + 1, records_at)
    table[2] = table[3] + 1  # block 2 now starts after block 3's first record: a record of block 2 has no block
    Path(f"{path}.index").write_bytes(reseal_body(bytes(index)))
    with varstore.open(path) as reader:
        assert reader._slicer.get(hidden) is None
        with pytest.raises(CorruptRecordError, match=f"record {hidden}"):
            reader[hidden]
