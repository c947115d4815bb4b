"""Shards of compressed blocks (spec/FORMAT.md §1.7, format 3.0) through varstore's Writer and Reader: round trips of
every codec, batches against single reads, one decode per block, damaged blocks, tables and frames refused with
the right error, full verification listing every damaged record, and the 2.x readers' refusal of 3.x."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import blocks as block_format
from varstore.format.checksum import crc32c
from varstore.format.notation import to_json

from . import spec_reader, spec_reader_2_0

_TEXT = st.text(st.characters(codec="utf-8"), max_size=80)
_SIZES = st.one_of(st.integers(0, 300), st.integers(0, 300), st.integers(16_000, 40_000), st.just(0))
RECORDS = {
    "bytes": (st.lists(_SIZES.flatmap(lambda size: st.binary(min_size=size, max_size=size)), max_size=40), {}),
    "str": (st.lists(st.one_of(_TEXT, st.integers(16_384, 20_000).map(lambda size: "é" * (size // 2))), max_size=40), {}),
    "ndarray": (st.lists(st.integers(0, 40).map(lambda rows: np.arange(rows * 3, dtype="<u2").reshape(-1, 3)), max_size=40),
                {"dtype": "<u2", "shape": (3,)}),
    "msgpack": (st.lists(st.dictionaries(st.sampled_from("abc"), st.one_of(st.integers(-5, 1 << 40), _TEXT, st.binary(max_size=40))),
                         max_size=40), {}),
}
BLOCKS = ("zstd-blocks", "zstd-dict-blocks")


def _text(value) -> str:
    return json.dumps(to_json(value), ensure_ascii=False, allow_nan=False)


def _write(prefix: Path, records: list, codec: str = "str", compression: str = "zstd-blocks", **options) -> Path:
    with varstore.Writer(prefix, codec, compression=compression, overwrite=True, **options) as writer:
        writer.extend(records)
    return prefix


def _table(prefix: Path) -> dict:
    """The header fields and block table of a 3.x shard, read from its index by §1.7's layout."""
    index = Path(f"{prefix}.index").read_bytes()
    count, metadata_size = struct.unpack_from("<Q", index, 16)[0], struct.unpack_from("<Q", index, 32)[0]
    dictionary_size = struct.unpack_from("<I", index, 52)[0]
    offsets_start = -(-(-(-(64 + metadata_size) // 8) * 8 + dictionary_size) // 8) * 8
    blocks_start = offsets_start + 8 * (count + 1)
    (block_count,) = struct.unpack_from("<Q", index, blocks_start)
    offsets_at = blocks_start + 8
    records_at = offsets_at + 8 * (block_count + 1)
    return {"count": count, "blocks": block_count, "offsets_start": offsets_start, "blocks_start": blocks_start,
            "block_offsets": list(struct.unpack_from(f"<{block_count + 1}Q", index, offsets_at)),
            "block_records": list(struct.unpack_from(f"<{block_count + 1}Q", index, records_at)),
            "checksums_at": records_at + 8 * (block_count + 1), "records_at": records_at, "offsets_at": offsets_at}


def _rewrite_index(prefix: Path, position: int, raw: bytes) -> None:
    """Put `raw` at `position` of the index and make its body and header checksums right again."""
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    index[position : position + len(raw)] = raw
    struct.pack_into("<I", index, 48, crc32c(bytes(index[64:])))
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    Path(f"{prefix}.index").write_bytes(bytes(index))


def _lines(count: int) -> list[str]:
    return [f"line {i}: the reader finds the block of a record by bisection, {i * 7919 % 10007}" for i in range(count)]


# -- round trips -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", BLOCKS)
@pytest.mark.parametrize("codec", sorted(RECORDS))
def test_every_codec_round_trips_in_blocks_through_varstore_and_the_spec_reader(codec, compression, tmp_path_factory):
    strategy, options = RECORDS[codec]

    @settings(max_examples=20)
    @given(records=strategy, repeats=st.integers(1, 30))
    def round_trip(records, repeats):
        records = records * repeats  # repeats give the dictionary trainer a sample it can train on
        prefix = _write(tmp_path_factory.mktemp("shard") / "s", records, codec, compression, **options)
        expected = [_text(record) for record in records]
        with varstore.open(prefix) as reader:
            assert reader.header.version == (3, 0) and reader.header.flags == 0
            reader.verify()
            assert [_text(record) for record in reader] == expected
            assert [_text(reader[i]) for i in range(len(reader))] == expected
            picked = list(range(len(records)))[::-3]
            assert [_text(record) for record in reader.get_batch(picked)] == [expected[i] for i in picked]
            assert int(reader.record_sizes().sum()) == sum(batch.values.nbytes for batch in reader.iter_flat(7))
        spec_records = spec_reader.read_shard(str(prefix))["records"]
        assert [json.dumps(spec_reader.notation(record), ensure_ascii=False, allow_nan=False) for record in spec_records] == expected

    round_trip()


def test_the_writer_closes_blocks_at_the_target_and_puts_a_larger_record_alone(tmp_path):
    target = block_format.BLOCK_TARGET
    records = [b"a" * (target // 2 + target // 8), b"b" * (target // 2 - target // 8), b"c" * 100, b"d" * (target - 84),
               b"e" * (target + 3616), b"", b"", b"f"]
    table = _table(_write(tmp_path / "s", records, "bytes"))
    # [a, b] reach the target exactly; c + d would pass it; d + e would; e is alone; the empties and f end the shard
    assert np.diff(table["block_records"]).tolist() == [2, 1, 1, 1, 3]


def test_records_exactly_fill_a_block_at_the_target_and_the_next_starts_a_new_one(tmp_path):
    records = [b"x" * (block_format.BLOCK_TARGET // 4)] * 9
    assert np.diff(_table(_write(tmp_path / "s", records, "bytes"))["block_records"]).tolist() == [4, 4, 1]


def test_an_empty_shard_has_no_blocks_and_reads_as_empty(tmp_path):
    prefix = _write(tmp_path / "s", [], "str")
    with varstore.open(prefix) as reader:
        assert len(reader) == 0 and reader.header.version == (3, 0) and list(reader) == []
        reader.verify()
    assert _table(prefix)["blocks"] == 0 and Path(f"{prefix}.data").stat().st_size == 0


def test_sharded_writer_and_extend_flat_write_blocks(tmp_path):
    with varstore.ShardedWriter(tmp_path / "d", "bytes", max_shard_records=300, compression="zstd-blocks") as writer:
        writer.extend_flat(b"".join(bytes([i % 256]) * (i % 50) for i in range(1000)), [i % 50 for i in range(1000)])
    with varstore.open(tmp_path / "d") as dataset:
        assert dataset.get_batch([999, 0, 301]) == [bytes([999 % 256]) * 49, b"", bytes([301 % 256]) * 1]
        dataset.verify()


def test_blocks_store_small_records_smaller_than_a_frame_each(tmp_path):
    records = _lines(4000)
    _write(tmp_path / "frames", records, compression="zstd")
    _write(tmp_path / "blocks", records, compression="zstd-blocks")
    assert Path(tmp_path / "blocks.data").stat().st_size < 0.5 * Path(tmp_path / "frames.data").stat().st_size


# -- batches and the decoded block ------------------------------------------------------------------------


def test_get_batch_equals_single_reads_in_any_order_with_repeats(tmp_path):
    records = _lines(3000)
    prefix = _write(tmp_path / "s", records, compression="zstd-dict-blocks")
    order = np.random.default_rng(5).integers(0, len(records), 700)
    with varstore.open(prefix) as reader:
        singles = [reader[int(i)] for i in order]
        assert reader.get_batch(order) == singles == [records[i] for i in order]
        flat = reader.get_batch_flat(order)
        assert [bytes(flat.values[a:b]).decode() for a, b in zip(flat.offsets, flat.offsets[1:])] == singles


def _count_decodes(reader, monkeypatch) -> list[int]:
    """Each block size the reader's decompressor is asked to decode, one entry per frame, on the Python path (the C
    extension's single reads, which keep their own last block, are counted in tests/test_frame_slicer_native.py)."""
    reader._fast_get = None
    decompressor = reader._index.blocks.decompressor
    sizes: list[int] = []
    single, many = decompressor.decompress, decompressor.decompress_many
    monkeypatch.setattr(decompressor, "decompress", lambda data, start, end, size: sizes.append(size) or single(data, start, end, size))
    monkeypatch.setattr(decompressor, "decompress_many",
                        lambda data, starts, ends, block_sizes: sizes.extend(np.asarray(block_sizes).tolist()) or many(data, starts, ends, block_sizes))
    return sizes


def test_sequential_reads_and_iteration_decode_each_block_once(tmp_path, monkeypatch):
    records = _lines(5000)
    prefix = _write(tmp_path / "s", records)
    blocks = _table(prefix)["blocks"]
    with varstore.open(prefix) as reader:
        decoded = _count_decodes(reader, monkeypatch)
        assert [reader[i] for i in range(len(reader))] == records
        assert len(decoded) == blocks
        decoded.clear()
        assert list(reader) == records
        assert len(decoded) == blocks


def test_a_batch_decodes_each_distinct_block_once(tmp_path, monkeypatch):
    records = _lines(3000)
    prefix = _write(tmp_path / "s", records)
    first = _table(prefix)["block_records"]
    with varstore.open(prefix) as reader:
        decoded = _count_decodes(reader, monkeypatch)
        wanted = [first[3], first[1] + 2, first[3] + 1, first[1], first[3] + 5]
        assert reader.get_batch(wanted) == [records[i] for i in wanted]
        assert len(decoded) == 2


def test_the_kept_block_is_replaced_whole_by_concurrent_readers(tmp_path):
    """Threads reading different blocks of one reader never see another block's bytes for their record."""
    import threading

    records = _lines(4000)
    prefix = _write(tmp_path / "s", records)
    failures: list[str] = []
    with varstore.open(prefix) as reader:

        def read(seed: int) -> None:
            for i in np.random.default_rng(seed).integers(0, len(records), 400).tolist():
                if reader[i] != records[i]:
                    failures.append(f"record {i}")

        threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


def test_verify_reads_is_accepted_since_every_read_checks_its_block(tmp_path):
    prefix = _write(tmp_path / "s", _lines(100))
    with varstore.open(prefix, verify_reads=True) as reader:
        assert reader[7] == _lines(100)[7]


def test_as_array_of_a_block_shard_is_refused(tmp_path):
    prefix = _write(tmp_path / "s", [np.arange(6, dtype="<u2")], "ndarray", dtype="<u2")
    with varstore.open(prefix) as reader:
        with pytest.raises(varstore.RecordTypeError, match="compressed"):
            reader.as_array()


# -- damage --------------------------------------------------------------------------------------------------


def _damaged_block_checksum(prefix: Path, block: int) -> None:
    table = _table(prefix)
    position = table["checksums_at"] + 4 * block
    (value,) = struct.unpack_from("<I", Path(f"{prefix}.index").read_bytes(), position)
    _rewrite_index(prefix, position, struct.pack("<I", value ^ 1))


def test_a_damaged_block_checksum_refuses_every_record_of_that_block_and_no_other(tmp_path):
    records = _lines(3000)
    prefix = _write(tmp_path / "s", records)
    first = _table(prefix)["block_records"]
    _damaged_block_checksum(prefix, 2)
    with varstore.open(prefix) as reader:
        for i in (first[2], first[3] - 1):
            with pytest.raises(varstore.CorruptRecordError, match=f"record {i}: block 2 checksum is") as refusal:
                reader[i]
            assert refusal.value.records == [i] and refusal.value.path.endswith("s.data")
        assert reader[first[3]] == records[first[3]] and reader[first[2] - 1] == records[first[2] - 1]
        with pytest.raises(varstore.CorruptRecordError, match="block 2 checksum") as refusal:
            reader.get_batch([0, first[2] + 1, first[2] + 4])
        assert refusal.value.records == [first[2] + 1, first[2] + 4]


def test_a_frame_whose_content_size_is_not_the_block_size_is_refused(tmp_path):
    import zstandard

    records = _lines(2000)
    prefix = _write(tmp_path / "s", records)
    table = _table(prefix)
    data = Path(f"{prefix}.data").read_bytes()
    start, end = table["block_offsets"][1], table["block_offsets"][2]
    frame = zstandard.ZstdCompressor(level=3).compress(zstandard.ZstdDecompressor().decompress(data[start:end]) + b"!")
    Path(f"{prefix}.data").write_bytes(data[:start] + frame + data[end:])
    offsets = [*table["block_offsets"][:2], *(value + len(frame) - (end - start) for value in table["block_offsets"][2:])]
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    struct.pack_into(f"<{len(offsets)}Q", index, table["offsets_at"], *offsets)
    struct.pack_into("<I", index, table["checksums_at"] + 4, crc32c(frame))
    new_data = Path(f"{prefix}.data").read_bytes()
    edge = min(4096, len(new_data))
    struct.pack_into("<QQ", index, 24, len(new_data), struct.unpack_from("<Q", index, 32)[0])
    struct.pack_into("<II", index, 40, crc32c(new_data), crc32c(new_data[len(new_data) - edge :], crc32c(new_data[:edge])))
    Path(f"{prefix}.index").write_bytes(bytes(index))
    _rewrite_index(prefix, 0, b"")
    with varstore.open(prefix) as reader:
        assert reader[table["block_records"][1] - 1] == records[table["block_records"][1] - 1]
        with pytest.raises(varstore.CorruptRecordError, match="block 1 is not a valid frame.*declares"):
            reader[table["block_records"][1]]
        with pytest.raises(varstore.CorruptRecordError) as refusal:
            reader.verify()
    assert refusal.value.records == list(range(table["block_records"][1], table["block_records"][2]))


def test_a_block_table_out_of_order_refuses_the_records_whose_block_it_hides(tmp_path):
    records = _lines(3000)
    prefix = _write(tmp_path / "s", records)
    table = _table(prefix)
    first = table["block_records"]
    _rewrite_index(prefix, table["records_at"] + 8 * 3, struct.pack("<Q", first[5]))  # block_records[3] > [4]
    with varstore.open(prefix) as reader:
        assert reader[first[2] - 1] == records[first[2] - 1]
        with pytest.raises(varstore.CorruptRecordError, match=f"record {first[2]}: block 2"):
            reader[first[2]]
        with pytest.raises(varstore.CorruptRecordError, match="do not increase after block 3") as refusal:
            reader.verify()
        refused = []
        for i in range(len(reader)):
            try:
                reader[i]
            except varstore.CorruptRecordError:
                refused.append(i)
    assert refusal.value.records == refused and len(refused) >= first[3] - first[2]


@pytest.mark.parametrize("change, message", [
    (lambda table: (table["blocks_start"], struct.pack("<Q", table["count"] + 1)), "more than the shard's"),
    (lambda table: (table["records_at"] + 8 * table["blocks"], struct.pack("<Q", table["count"] - 1)), "block records run from 0 to"),
    (lambda table: (table["offsets_at"] + 8 * table["blocks"], struct.pack("<Q", table["block_offsets"][-1] - 1)), "block offsets run from 0 to"),
    (lambda table: (14, struct.pack("<H", 1)), "a 3.x shard has none"),
    (lambda table: (13, b"\x01"), "compression 1 is unknown; a 3.x shard"),
], ids=["B-over-N", "records-end", "offsets-end", "flag-bit-0", "compression-1"])
def test_a_damaged_table_or_header_is_refused_at_open(tmp_path, change, message):
    prefix = _write(tmp_path / "s", _lines(2000))
    _rewrite_index(prefix, *change(_table(prefix)))
    with pytest.raises(varstore.FormatError, match=message):
        varstore.open(prefix)


def test_verify_lists_every_record_of_every_damaged_block_and_every_undecodable_record(tmp_path):
    records = [f"row {i}" for i in range(12_000)]
    prefix = _write(tmp_path / "s", records, "str")
    table = _table(prefix)
    first = table["block_records"]
    _damaged_block_checksum(prefix, 0)
    data = bytearray(Path(f"{prefix}.data").read_bytes())
    data[table["block_offsets"][2] + 20] ^= 0xFF  # block 2's frame, its checksum computed again: the frame is damaged
    Path(f"{prefix}.data").write_bytes(bytes(data))
    frame = bytes(data[table["block_offsets"][2] : table["block_offsets"][3]])
    _rewrite_index(prefix, table["checksums_at"] + 8, struct.pack("<I", crc32c(frame)))
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    edge = min(4096, len(data))
    struct.pack_into("<II", index, 40, crc32c(bytes(data)), crc32c(bytes(data[len(data) - edge :]), crc32c(bytes(data[:edge]))))
    Path(f"{prefix}.index").write_bytes(bytes(index))
    _rewrite_index(prefix, 0, b"")
    with varstore.open(prefix) as reader:
        with pytest.raises(varstore.CorruptRecordError) as refusal:
            reader.verify()
    expected = list(range(first[0], first[1])) + list(range(first[2], first[3]))
    assert refusal.value.records == expected
    assert "fails its checksum" in str(refusal.value) or "fail their checksum" in str(refusal.value)


def test_verify_lists_records_that_fail_their_codec_inside_a_sound_block(tmp_path):
    import zstandard

    records = ["fine"] * 50
    prefix = _write(tmp_path / "s", records, "str")
    table = _table(prefix)
    decoded = bytearray(("fine" * 50).encode())
    decoded[4 * 7] = 0xFF  # record 7's first byte: not UTF-8
    frame = zstandard.ZstdCompressor(level=3).compress(bytes(decoded))
    Path(f"{prefix}.data").write_bytes(frame)
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    struct.pack_into("<Q", index, 24, len(frame))
    struct.pack_into("<II", index, 40, crc32c(frame), crc32c(frame, crc32c(frame)))
    struct.pack_into("<Q", index, table["offsets_at"] + 8, len(frame))
    struct.pack_into("<I", index, table["checksums_at"], crc32c(frame))
    Path(f"{prefix}.index").write_bytes(bytes(index))
    _rewrite_index(prefix, 0, b"")
    with varstore.open(prefix) as reader:
        assert reader[6] == "fine" and reader[8] == "fine"
        with pytest.raises(varstore.CorruptRecordError, match="record 7 does not decode as str"):
            reader[7]
        with pytest.raises(varstore.CorruptRecordError, match="1 record does not decode") as refusal:
            reader.verify()
    assert refusal.value.records == [7]


# -- other readers ---------------------------------------------------------------------------------------------


def test_a_2_x_layout_reader_refuses_a_3_x_shard_at_its_version_check(tmp_path):
    prefix = _write(tmp_path / "s", _lines(100))
    with pytest.raises(spec_reader_2_0.SpecError) as refusal:
        spec_reader_2_0.open_shard(str(prefix))
    assert refusal.value.rule == "§1.3 step 2"
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    struct.pack_into("<H", index, 8, 2)  # the same bytes called 2.x: its compression byte 3 is refused at step 4
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    Path(f"{prefix}.index").write_bytes(bytes(index))
    with pytest.raises(varstore.FormatError, match="compression 3 is unknown; a 2.x shard"):
        varstore.open(prefix)


def test_a_block_table_spooled_to_disk_while_writing_is_the_same_table(tmp_path, monkeypatch):
    """Offsets and block entries past the spool threshold go to temporary files and are copied back in order."""
    from varstore.shard import writer as writer_module

    records = [bytes([i % 251]) * (3000 + i % 5000) for i in range(400)]
    expected = _table(_write(tmp_path / "kept", records, "bytes"))
    monkeypatch.setattr(writer_module, "_SPOOL_ENTRIES", 3)
    prefix = _write(tmp_path / "spooled", records, "bytes")
    table = _table(prefix)
    assert table["blocks"] > 20 and table["block_records"] == expected["block_records"]
    assert table["block_offsets"] == expected["block_offsets"]
    assert Path(f"{prefix}.index").read_bytes() == Path(f"{tmp_path / 'kept'}.index").read_bytes()
    with varstore.open(prefix) as reader:
        reader.verify()
        assert reader.get_batch([399, 0, 200]) == [records[399], records[0], records[200]]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kept.data", "kept.index", "spooled.data", "spooled.index"]
