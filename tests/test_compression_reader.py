"""Reading compressed shards (issue 24 step C): one decompressor (and so one parsed dictionary) per dictionary per
process, shared by every reader of the shard and freed with the last; a single read of an ``ndarray`` record
decodes its one frame, not through the batch path; the open parses the metadata once."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore
from varstore.errors import CorruptRecordError
from varstore.format import compression as zstd_format
from varstore.shard import index as index_module
from varstore.shard import reader as reader_module

WORDS = ["token", "shard", "frame", "record", "reader", "dictionary", "window", "level"]
TEXTS = [" ".join(WORDS[(k + j * 5) % len(WORDS)] for j in range(6 + k % 11)) + f" {k}" for k in range(800)]
TOKENS = [np.arange(k % 97, dtype=np.uint16) * 3 + k % 5 for k in range(600)]


def write_shard(path: Path, records: list, codec: str = "str", **options) -> Path:
    with varstore.Writer(path, codec, **options) as writer:
        writer.extend(records)
    return path


def test_readers_of_one_shard_share_its_decompressor_and_the_last_to_go_frees_it(tmp_path):
    shard = write_shard(tmp_path / "texts", TEXTS, compression="zstd-dict")
    first, second = varstore.open(shard), varstore.open(shard)
    shared = first._index.decompressor
    assert shared is not None and shared.dictionary
    assert second._index.decompressor is shared
    assert first[5] == second[5] == TEXTS[5]
    other = write_shard(tmp_path / "other", TEXTS[::-1], compression="zstd-dict")
    with varstore.open(other) as third:
        assert third._index.decompressor is not shared  # another dictionary
    alive = weakref.ref(shared)
    del shared
    first.close()
    del first
    gc.collect()
    assert alive() is not None  # `second` still reads with it
    assert second.get_batch([0, 799]) == [TEXTS[0], TEXTS[799]]
    second.close()
    del second
    gc.collect()
    assert alive() is None


def test_each_thread_decodes_with_a_context_of_its_own_from_the_one_dictionary(tmp_path):
    shard = write_shard(tmp_path / "texts", TEXTS, compression="zstd-dict")
    with varstore.open(shard) as reader:
        decompressor = reader._index.decompressor

        def read_all(_: int) -> object:
            assert list(reader) == TEXTS
            assert reader.get_batch(range(799, -1, -1)) == TEXTS[::-1]
            return decompressor._context()

        with ThreadPoolExecutor(max_workers=4) as pool:
            barrier = threading.Barrier(4, timeout=120)  # all four threads alive at once: no thread is reused
            contexts = list(pool.map(lambda k: (barrier.wait(), read_all(k))[1], range(4)))
    assert len({id(context) for context in contexts}) == 4


def test_a_single_read_of_a_compressed_ndarray_record_decodes_its_frame_without_the_batch_path(tmp_path, monkeypatch):
    shard = write_shard(tmp_path / "tokens", TOKENS, "ndarray", dtype="uint16", compression="zstd")
    with varstore.open(shard) as reader:
        assert reader.header.compression == zstd_format.ZSTD

        def refuse(*args, **kwargs):
            raise AssertionError("a single read went through the batch path")

        monkeypatch.setattr(reader_module, "decompressed", refuse)
        monkeypatch.setattr(zstd_format.Decompressor, "decompress_many", refuse)
        for index in (0, 1, 96, 97, 599, -1):
            record = reader[index]
            assert record.dtype == np.uint16 and np.array_equal(record, TOKENS[index])


def test_a_single_read_refuses_a_compressed_record_of_partial_rows(tmp_path):
    """A frame whose declared (and decoded) size is not whole rows: forged by rewriting one record's frame and its
    decoded size in the index, with the record's CRC32C left as it is (reads check the frame, not the CRC)."""
    shard = write_shard(tmp_path / "tokens", [np.arange(4, dtype=np.uint16)] * 3, "ndarray", dtype="uint16",
                        compression="zstd", checksums=False)
    with varstore.open(shard) as reader:
        header, offsets = reader.header, reader.offsets.tolist()
    index = bytearray(Path(f"{shard}.index").read_bytes())
    data = bytearray(Path(f"{shard}.data").read_bytes())
    odd = zstd_format.Compressor(zstd_format.ZSTD, 3).compress(b"\x01\x02\x03")  # 3 bytes: one and a half rows
    assert len(odd) <= offsets[2] - offsets[1]
    frame_at, frame_end = offsets[1], offsets[2]
    data[frame_at:frame_end] = odd
    shift = len(odd) - (frame_end - frame_at)
    new_offsets = [offset if k <= 1 else offset + shift for k, offset in enumerate(offsets)]
    np.frombuffer(index, "<u8", len(offsets), header.offsets_start)[:] = new_offsets
    np.frombuffer(index, "<u4", header.record_count, header.sizes_start)[1] = 3
    forged = _rechecksummed(index, bytes(data), header)
    Path(f"{shard}.index").write_bytes(forged)
    Path(f"{shard}.data").write_bytes(bytes(data))
    with varstore.open(shard) as reader:
        assert np.array_equal(reader[0], np.arange(4, dtype=np.uint16))
        with pytest.raises(CorruptRecordError, match="record 1 does not decode as ndarray") as refusal:
            reader[1]
        assert refusal.value.records == [1]
        with pytest.raises(CorruptRecordError, match="record 1"):
            reader.get_batch([1])


def _rechecksummed(index: bytearray, data: bytes, header) -> bytes:
    """`index` with its header's data size, data CRC32C, edge CRC32C, body CRC32C and header CRC32C made those of
    `data` and of itself again (the spec's §1.2 fields), so that only the forged record is wrong."""
    from varstore.format import header as fmt
    from varstore.format.checksum import crc32c

    forged = fmt.Header(
        codec_id=header.codec_id, flags=header.flags, record_count=header.record_count, data_size=len(data),
        metadata_size=header.metadata_size, data_crc32c=crc32c(data),
        data_edge_crc32c=fmt.edge_crc32c(*(data[offset : offset + length] for offset, length in fmt.edge_ranges(len(data)))),
        body_crc32c=crc32c(bytes(index[fmt.HEADER_SIZE :])), minor_version=header.minor_version,
        compression=header.compression, dictionary_size=header.dictionary_size, dictionary_crc32c=header.dictionary_crc32c,
    )
    return forged.pack() + bytes(index[fmt.HEADER_SIZE :])


def test_opening_a_compressed_shard_parses_its_metadata_once(tmp_path, monkeypatch):
    shard = write_shard(tmp_path / "texts", TEXTS, compression="zstd-dict")
    parses: list[int] = []
    parse = index_module.parse_strict_json

    def counting(raw, *args, **kwargs):
        parses.append(len(raw))
        return parse(raw, *args, **kwargs)

    monkeypatch.setattr(index_module, "parse_strict_json", counting)
    with varstore.open(shard) as reader:
        assert len(parses) == 1
        assert reader[3] == TEXTS[3]
        assert len(parses) == 1
