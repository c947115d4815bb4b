"""Format 3.0, compressed blocks (spec/FORMAT.md §1.7), judged by the spec-only reader and writer.

The spec-only writer's shards read back through the spec-only reader and through varstore, and varstore's block
shards through the spec-only reader; the frozen 2.0 and 1.1 readers refuse every 3.x shard at §1.3 step 2; named
mutations of a valid shard (every checksum they do not target computed again) are refused for their §6.3 label at
their point; and after random byte flips, with the checksums made right again, both readers agree on which reads
fail and what the others return.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import compression as varstore_compression
from varstore.format.notation import to_json

from . import spec_reader, spec_reader_1_1, spec_reader_2_0
from .spec_writer import Map, ShardBytes, canonical_json, msgpack_bytes, write_shard
from .spec_writer_blocks import BlockShardParts, assemble, block_parts, frame_of, write_block_shard
from .test_spec_damaged import _spec_refusal, _varstore_refusal

VARSTORE_READS_BLOCKS = "zstd-blocks" in varstore_compression.NAMES.values()
VARSTORE_WRITES_BLOCKS = "zstd-blocks" in varstore_compression.CHOICES
needs_varstore_reader = pytest.mark.skipif(not VARSTORE_READS_BLOCKS, reason="varstore does not know compression 3 (zstd-blocks, §1.7) yet")
needs_varstore_writer = pytest.mark.skipif(not VARSTORE_WRITES_BLOCKS, reason='varstore\'s Writer does not take compression="zstd-blocks" (§1.7) yet')


@functools.cache
def _dictionary(dict_id: int) -> bytes:
    """A zstd dictionary (RFC 8878 §5) with this Dictionary_ID, trained on lines like the test records."""
    import zstandard

    samples = [f"record {i}: word{i % 17} and {i * 7 % 101} more words".encode() for i in range(2000)]
    return zstandard.train_dictionary(1024, samples, dict_id=dict_id).as_bytes()


def _write(directory: Path, shard: ShardBytes) -> str:
    (directory / "s.index").write_bytes(shard.index)
    (directory / "s.data").write_bytes(shard.data)
    return str(directory / "s")


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


# -- records of every codec, in random block groupings --------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_MSGPACK_VALUE = st.dictionaries(st.sampled_from("abc"), st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), _TEXT, st.binary(max_size=20)))
PAYLOADS = {  # codec -> (its parameters, a strategy of one record's payload)
    "bytes": ({}, st.binary(max_size=80)),
    "str": ({}, _TEXT.map(str.encode)),
    "ndarray": ({"dtype": "<i4", "shape": [2]}, st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=12).map(
        lambda values: np.array(values[: len(values) // 2 * 2], "<i4").tobytes())),
    "msgpack": ({}, _MSGPACK_VALUE.map(lambda value: msgpack_bytes(Map(tuple(value.items()))))),
}


@st.composite
def _grouping(draw, count: int) -> list[int]:
    """Record counts per block, each at least 1, summing to `count`: one block, one record a block, or any cut."""
    cuts = draw(st.one_of(st.just(set()), st.just(set(range(1, count))), st.sets(st.integers(1, max(1, count - 1)))))
    bounds = [0, *sorted(cut for cut in cuts if 0 < cut < count), count] if count else [0]
    return [last - first for first, last in zip(bounds, bounds[1:])]


@st.composite
def _block_shards(draw, codec: str) -> tuple[list[bytes], list[int]]:
    payloads = draw(st.lists(PAYLOADS[codec][1], max_size=30))
    return payloads, draw(_grouping(len(payloads)))


def _expected(codec: str, payloads: list[bytes]) -> list[str]:
    """Each payload decoded under its codec on its own, no shard involved, in the notation (§6.1)."""
    decoder = spec_reader.codec_from(codec, PAYLOADS[codec][0], "§2")
    return [_text(spec_reader.notation(spec_reader.decode_record(decoder, payload))) for payload in payloads]


@pytest.mark.parametrize("with_dictionary", [False, True], ids=["zstd-blocks", "zstd-dict-blocks"])
@pytest.mark.parametrize("codec", sorted(PAYLOADS))
def test_spec_writer_shards_read_back_through_the_spec_reader(codec, with_dictionary, tmp_path_factory):
    @given(shard=_block_shards(codec))
    def round_trip(shard):
        payloads, counts = shard
        prefix = _write(tmp_path_factory.mktemp("s"), write_block_shard(codec, PAYLOADS[codec][0], payloads, counts, _dictionary(7) if with_dictionary else b""))
        read = spec_reader.read_shard(prefix)
        assert read["format_version"] == [3, 0] and read["blocks"] == counts
        assert read["compression"] == ("zstd-dict-blocks" if with_dictionary else "zstd-blocks")
        assert [_text(spec_reader.notation(record)) for record in read["records"]] == _expected(codec, payloads)

    round_trip()


@needs_varstore_reader
@pytest.mark.parametrize("with_dictionary", [False, True], ids=["zstd-blocks", "zstd-dict-blocks"])
@pytest.mark.parametrize("codec", sorted(PAYLOADS))
def test_spec_writer_shards_read_back_through_varstore(codec, with_dictionary, tmp_path_factory):
    @given(shard=_block_shards(codec))
    def round_trip(shard):
        payloads, counts = shard
        prefix = _write(tmp_path_factory.mktemp("s"), write_block_shard(codec, PAYLOADS[codec][0], payloads, counts, _dictionary(7) if with_dictionary else b""))
        expected = _expected(codec, payloads)
        with varstore.open(prefix) as reader:
            reader.verify()
            assert [_text(to_json(record)) for record in reader] == expected
            assert [_text(to_json(reader[i])) for i in reversed(range(len(reader)))] == expected[::-1]
            assert reader.record_sizes().tolist() == [len(payload) for payload in payloads]  # §1.7: sizes in decoded space

    round_trip()


_VARSTORE_RECORDS = {  # codec -> (Writer options, a strategy of records as varstore takes them)
    "bytes": ({}, st.binary(max_size=3000)),
    "str": ({}, _TEXT),
    "ndarray": ({"dtype": "<u2"}, st.lists(st.integers(0, 65535), max_size=40).map(lambda values: np.array(values, "<u2"))),
    "msgpack": ({}, _MSGPACK_VALUE),
}


def _block_sizes(prefix: str) -> list[tuple[int, int]]:
    """(decoded size, record count) of each block of a 3.x shard, from the spec-only reader."""
    shard = spec_reader.open_shard(prefix)
    records, offsets = shard.blocks.records, shard.offsets
    return [(offsets[last] - offsets[first], last - first) for first, last in zip(records, records[1:])]


@needs_varstore_writer
@pytest.mark.parametrize("compression", ["zstd-blocks", "zstd-dict-blocks"])
@pytest.mark.parametrize("codec", sorted(_VARSTORE_RECORDS))
def test_varstore_block_shards_read_back_through_the_spec_reader(codec, compression, tmp_path_factory):
    options, strategy = _VARSTORE_RECORDS[codec]

    @settings(max_examples=25)
    @given(records=st.lists(strategy, max_size=40), repeats=st.integers(1, 60))
    def round_trip(records, repeats):
        records = records * repeats  # repeats give the dictionary trainer a sample it can train on
        prefix = tmp_path_factory.mktemp("s") / "s"
        with varstore.Writer(prefix, codec, compression=compression, **options) as writer:
            writer.extend(records)
        read = spec_reader.read_shard(str(prefix))
        assert read["format_version"] == [3, 0] and read["compression"] in ("zstd-blocks", compression)
        assert sum(read["blocks"]) == len(records)
        assert [_text(spec_reader.notation(record)) for record in read["records"]] == [_text(to_json(record)) for record in records]

    round_trip()


@needs_varstore_writer
def test_varstore_closes_a_block_at_8_kib_and_before_a_record_that_would_pass_it(tmp_path):
    """§1.7's writer: a block closes when it reaches 8 KiB of decoded bytes and before a record that would take a
    non-empty block past that, so only a block of one record is larger."""
    sizes = [100, 8092, 1, 8191, 2, 20000, 0, 0, 5000, 7000, 100]
    with varstore.Writer(tmp_path / "s", "bytes", compression="zstd-blocks") as writer:
        writer.extend(bytes([i]) * size for i, size in enumerate(sizes))
    assert _block_sizes(str(tmp_path / "s")) == [(8192, 2), (8192, 2), (2, 1), (20000, 1), (5000, 3), (7100, 2)]


# -- the frozen readers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("frozen", [spec_reader_2_0, spec_reader_1_1], ids=["2.0", "1.1"])
def test_frozen_readers_refuse_every_3x_shard_at_step_2(frozen, tmp_path_factory):
    """Step 2 comes before the header's CRC and its compression byte: any 3.x header is refused there."""

    @given(shard=_block_shards("bytes"), with_dictionary=st.booleans(), minor=st.integers(0, 65535), tail=st.binary(min_size=52, max_size=52))
    def refused(shard, with_dictionary, minor, tail):
        payloads, counts = shard
        written = write_block_shard("bytes", {}, payloads, counts, _dictionary(7) if with_dictionary else b"")
        for index in (written.index, written.index[:8] + struct.pack("<HH", 3, minor) + tail + written.index[64:]):
            prefix = _write(tmp_path_factory.mktemp("s"), ShardBytes(index, written.data))
            with pytest.raises(frozen.SpecError) as refusal:
                frozen.open_shard(prefix)
            assert refusal.value.rule == "§1.3 step 2"

    refused()


COMPRESSED = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "compressed"
BLOCK_VECTORS = sorted(path.stem for path in COMPRESSED.glob("*blocks*.json"))
FRAME_VECTORS = sorted(path.stem for path in COMPRESSED.glob("*.json") if "blocks" not in path.stem)


def test_the_block_vectors_of_section_6_are_there():
    assert BLOCK_VECTORS == ["zstd-blocks-bytes-empty-records", "zstd-blocks-msgpack-rows", "zstd-dict-blocks-str-lines"]


@pytest.mark.parametrize("name", BLOCK_VECTORS)
def test_spec_reader_reads_a_block_vector_to_its_records_and_blocks(name):
    expected = json.loads((COMPRESSED / f"{name}.json").read_text(encoding="utf-8"))
    read = spec_reader.read_shard(str(COMPRESSED / name))
    assert (read["format_version"], read["compression"], read["blocks"]) == ([3, 0], expected["compression"], expected["blocks"])
    assert [_text(spec_reader.notation(record)) for record in read["records"]] == [_text(record) for record in expected["records"]]


@pytest.mark.parametrize("name", BLOCK_VECTORS)
def test_the_2_0_reader_refuses_every_block_vector_at_step_2(name):
    with pytest.raises(spec_reader_2_0.SpecError) as refusal:
        spec_reader_2_0.open_shard(str(COMPRESSED / name))
    assert refusal.value.rule == "§1.3 step 2"


@pytest.mark.parametrize("name", FRAME_VECTORS)
def test_the_2_0_reader_still_reads_every_2_0_vector(name):
    assert spec_reader_2_0.read_shard(str(COMPRESSED / name))["format_version"] == [2, 0]


def test_a_dataset_mixes_1_x_2_x_and_3_x_shards_for_both_readers(tmp_path):
    """§5: a 3.x reader reads 1.x and 2.x shards as they say, and a dataset may mix all three."""
    one = write_shard({"codec": "bytes", "codec_params": {}, "metadata": {}, "record_checksums": True, "records": [{"$bytes": "0102"}]})
    two = ShardBytes((COMPRESSED / "zstd-bytes-empty-records.index").read_bytes(), (COMPRESSED / "zstd-bytes-empty-records.data").read_bytes())
    three = write_block_shard("bytes", {}, BASE_PAYLOADS, BASE_COUNTS)
    entries = []
    for name, shard in (("one", one), ("two", two), ("three", three)):
        (tmp_path / f"{name}.index").write_bytes(shard.index)
        (tmp_path / f"{name}.data").write_bytes(shard.data)
        record_count, data_size = struct.unpack_from("<QQ", shard.index, 16)
        entries.append({"name": name, "records": record_count, "data_size": data_size, "index_size": len(shard.index),
                        "index_crc32c": spec_reader.crc32c(shard.index), "data_crc32c": struct.unpack_from("<I", shard.index, 40)[0]})
    manifest = {"format": "varstore-dataset", "version": 1, "codec": {"name": "bytes", "params": {}}, "metadata": {}, "shards": entries}
    (tmp_path / "manifest.json").write_bytes(canonical_json({**manifest, "crc32c": spec_reader.crc32c(canonical_json(manifest))}))
    second = json.loads((COMPRESSED / "zstd-bytes-empty-records.json").read_text(encoding="utf-8"))["records"]
    expected = [_text({"$bytes": "0102"})] + [_text(record) for record in second] + [_text({"$bytes": payload.hex()}) for payload in BASE_PAYLOADS]
    read = spec_reader.read_dataset(str(tmp_path))
    assert [_text(spec_reader.notation(record)) for shard in read["shards"] for record in shard["records"]] == expected
    if VARSTORE_READS_BLOCKS:
        with varstore.open(tmp_path) as dataset:
            dataset.verify()
            assert [_text(to_json(record)) for record in dataset] == expected


# -- named mutations of a valid 3.0 shard ----------------------------------------------------------------------

# Six records of distinct sizes (offsets 0 5 11 18 23 32 39) in three blocks of two: block_records [0, 2, 4, 6].
BASE_PAYLOADS = [b"alpha", b"bravo!", b"charlie", b"delta", b"echo echo", b"foxtrot"]
BASE_COUNTS = [2, 2, 2]


def _base(counts: list[int] = BASE_COUNTS, dictionary: bytes = b"") -> BlockShardParts:
    """The valid shard of BASE_PAYLOADS every mutation starts from."""
    return block_parts("bytes", {}, BASE_PAYLOADS, counts, dictionary)


def _block_content(b: int) -> bytes:
    """The decoded bytes of the base shard's block b."""
    return b"".join(BASE_PAYLOADS[sum(BASE_COUNTS[:b]) : sum(BASE_COUNTS[: b + 1])])


def _checksum_flipped(parts: BlockShardParts, b: int) -> BlockShardParts:
    return replace(parts, block_checksums=[checksum ^ (k == b) for k, checksum in enumerate(parts.block_checksums)])


def _with_frame(parts: BlockShardParts, b: int, frame: bytes) -> BlockShardParts:
    """`parts` with block b stored as `frame`: its checksum computed again and the later blocks' offsets moved."""
    start, end = parts.block_offsets[b], parts.block_offsets[b + 1]
    shift = len(frame) - (end - start)
    checksums = list(parts.block_checksums)
    checksums[b] = spec_reader.crc32c(frame)
    block_offsets = parts.block_offsets[: b + 1] + [offset + shift for offset in parts.block_offsets[b + 1 :]]
    return replace(parts, data=parts.data[:start] + frame + parts.data[end:], block_offsets=block_offsets, block_checksums=checksums)


def _with_header(shard: ShardBytes, position: int, value: int) -> ShardBytes:
    """`shard` with the u32 header field at `position` set to `value` and `header_crc32c` computed again."""
    header = shard.index[:position] + struct.pack("<I", value) + shard.index[position + 4 : 60]
    return ShardBytes(header + struct.pack("<I", spec_reader.crc32c(header)) + shard.index[64:], shard.data)


def _bomb(b: int) -> bytes:
    """A frame of 8 MiB of zeros (about 300 bytes) whose header claims block b's size: a 4-byte content size field."""
    frame = bytearray(frame_of(bytes(8 << 20), b""))
    descriptor = frame[4]
    assert descriptor >> 6 == 2 and not descriptor & 0x20 and not descriptor & 3  # 4-byte size after the window byte
    frame[6:10] = struct.pack("<I", len(_block_content(b)))
    return bytes(frame)


def _more_blocks_than_records() -> ShardBytes:
    """One record a block, then a seventh, empty block: B = 7 > N = 6, with a table that is otherwise in order."""
    parts = _base(counts=[1] * 6)
    end = parts.block_offsets[-1]
    return assemble(replace(parts, block_offsets=[*parts.block_offsets, end], block_records=[*parts.block_records, 6],
                            block_checksums=[*parts.block_checksums, spec_reader.crc32c(b"")], block_count=7))


def _offsets_in(parts: BlockShardParts, changed: dict[int, int]) -> BlockShardParts:
    return replace(parts, offsets=[changed.get(i, offset) for i, offset in enumerate(parts.offsets)])


def _block_offsets_reversed(parts: BlockShardParts, b: int) -> BlockShardParts:
    """Block b's stored range ending a byte before it starts (and block b + 1's starting there)."""
    block_offsets = list(parts.block_offsets)
    block_offsets[b + 1] = block_offsets[b] - 1
    return replace(parts, block_offsets=block_offsets)


DATA_CRC32C, BODY_CRC32C, DICTIONARY_CRC32C = 40, 48, 56  # header positions (§1.2)

# name -> (the damaged shard, where a reader must refuse it: ("open" | "read" | "verify", record, §6.3 label))
MUTATIONS: dict[str, tuple[Callable[[], ShardBytes], tuple[str, int | None, str]]] = {
    "block-checksum-wrong": (lambda: assemble(_checksum_flipped(_base(), 1)), ("read", 2, "§1.7")),
    "more-blocks-than-records": (_more_blocks_than_records, ("open", None, "§1.3 step 6")),
    "block-records-end-before-n": (lambda: assemble(replace(_base(), block_records=[0, 2, 4, 5])), ("open", None, "§1.7")),
    "block-offsets-end-before-data-size": (lambda: assemble(replace(_base(), data=_base().data + b"\0")), ("open", None, "§1.7")),
    # bisect(2) over [0, 2, 9, 6] finds block 1, which brackets record 2 but claims records up to 9, past N
    "block-records-past-n": (lambda: assemble(replace(_base(), block_records=[0, 2, 9, 6])), ("read", 2, "§1.7")),
    "flag-bit-0": (lambda: assemble(replace(_base(), flags=1)), ("open", None, "§1.3 step 4")),
    # bisect(1) over [0, 2, 1, 6] finds block 2, which claims records 1-5 and 34 decoded bytes: record 0 reads,
    # record 1's block (0) is hidden
    "block-records-out-of-order": (lambda: assemble(replace(_base(), block_records=[0, 2, 1, 6])), ("read", 1, "§1.7")),
    "frame-content-size-not-block-size": (lambda: assemble(_with_frame(_base(), 1, frame_of(_block_content(1) + b"!", b""))), ("read", 2, "§1.7")),
    "frame-of-another-dictionary": (
        lambda: assemble(_with_frame(_base(dictionary=_dictionary(7)), 1, frame_of(_block_content(1), _dictionary(8)))), ("read", 2, "§1.7")),
    "frame-without-dictionary-in-a-dictionary-shard": (
        lambda: assemble(_with_frame(_base(dictionary=_dictionary(7)), 1, frame_of(_block_content(1), b""))), ("read", 2, "§1.7")),
    "frame-zstd-bomb": (lambda: assemble(_with_frame(_base(), 1, _bomb(1))), ("read", 2, "§1.7")),
    "frame-followed-by-a-byte": (
        lambda: assemble(_with_frame(_base(), 1, frame_of(_block_content(1), b"") + b"\0")), ("read", 2, "§1.7")),
    "compression-3-in-a-2x-header": (lambda: assemble(replace(_base(), major_version=2)), ("open", None, "§1.3 step 4")),
    "compression-1-in-a-3x-header": (lambda: assemble(replace(_base(), compression=1)), ("open", None, "§1.3 step 4")),
    "compression-4-without-a-dictionary": (lambda: assemble(replace(_base(), compression=4)), ("open", None, "§1.3 step 4")),
    "compression-member-names-zstd": (
        lambda: assemble(replace(_base(), metadata=b'{"codec":{},"compression":{"name":"zstd"},"user":{}}')), ("open", None, "§1.7")),
    "dictionary-crc32c-wrong": (lambda: _with_header(assemble(_base(dictionary=_dictionary(7))), DICTIONARY_CRC32C, 1), ("open", None, "§1.7")),
    "offsets-0-not-0": (lambda: assemble(replace(_base(), offsets=[offset + 1 for offset in _base().offsets])), ("open", None, "§1.3 step 9")),
    "record-offsets-out-of-order-in-a-block": (lambda: assemble(_offsets_in(_base(), {3: 30})), ("read", 2, "§1.7")),
    "block-offsets-reversed": (lambda: assemble(_block_offsets_reversed(_base(), 1)), ("read", 2, "§1.7")),
    # block 2 (records 4 and 5) claims 2^32 + 7 decoded bytes
    "block-of-2-32-bytes": (lambda: assemble(_offsets_in(_base(), {5: 23 + (1 << 32), 6: 30 + (1 << 32)})), ("read", 4, "§1.7")),
    "str-record-not-utf-8-in-a-block": (
        lambda: assemble(block_parts("str", {}, [b"ok", b"\xff", b"fine", b"also"], [3, 1])), ("read", 1, "§2")),
    "body-crc32c-wrong": (lambda: _with_header(assemble(_base()), BODY_CRC32C, 1), ("verify", None, "§1.3 verify")),
    "data-crc32c-wrong": (lambda: _with_header(assemble(_base()), DATA_CRC32C, 1), ("verify", None, "§1.3 verify")),
}


def test_the_base_shard_is_valid_for_both_readers(tmp_path):
    prefix = _write(tmp_path, assemble(_base()))
    assert _spec_refusal(spec_reader.open_shard, prefix) == ("accepted", None, None)
    assert spec_reader.read_shard(prefix)["records"] == BASE_PAYLOADS
    if VARSTORE_READS_BLOCKS:
        assert _varstore_refusal(prefix) == ("accepted", None)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_spec_reader_refuses_each_mutation_for_its_label_at_its_point(name, tmp_path):
    damaged, expected = MUTATIONS[name]
    assert _spec_refusal(spec_reader.open_shard, _write(tmp_path, damaged())) == expected


@needs_varstore_reader
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_varstore_refuses_each_mutation_at_its_point(name, tmp_path):
    damaged, (point, record, _) = MUTATIONS[name]
    assert _varstore_refusal(_write(tmp_path, damaged())) == (point, record)


def test_verification_reports_every_record_of_a_damaged_block_and_each_bad_record(tmp_path):
    """§1.7: full verification names each record of a block whose frame is damaged, and each record failing its codec."""
    parts = block_parts("str", {}, [b"a", b"\xff", b"b", b"c", b"d", b"\xfe", b"e"], [2, 3, 2])
    prefix = _write(tmp_path, assemble(_checksum_flipped(parts, 1)))
    with pytest.raises(spec_reader.VerificationFailed) as failure:
        spec_reader.open_shard(prefix).verify()
    assert failure.value.damaged == {1: "§2", 2: "§1.7", 3: "§1.7", 4: "§1.7", 5: "§2"}
    if VARSTORE_READS_BLOCKS:
        with varstore.open(prefix) as reader, pytest.raises(varstore.CorruptRecordError) as refusal:
            reader.verify()
        assert sorted(refusal.value.records) == [1, 2, 3, 4, 5]


# -- random byte flips, checksums made right again --------------------------------------------------------------

FLIP_BASES = {  # name -> the parts of a valid shard of several blocks
    "bytes": lambda: _base(),
    "bytes-dictionary": lambda: _base(dictionary=_dictionary(7)),
    "str": lambda: block_parts("str", {}, [f"line {i} é".encode() * (i % 4) for i in range(9)], [3, 1, 4, 1]),
    "msgpack": lambda: block_parts("msgpack", {}, [msgpack_bytes(Map((("a", i), ("b", "x" * i)))) for i in range(7)], [2, 5]),
}


def _flipped(parts: BlockShardParts, file: str, position: int, mask: int) -> ShardBytes:
    """The shard of `parts` with one byte flipped, then every checksum made right again: the flipped data byte's
    block checksum, `data_crc32c`, `data_edge_crc32c`, `body_crc32c` and `header_crc32c`."""
    shard = assemble(parts)
    index, data = bytearray(shard.index), bytearray(shard.data)
    if file == "index":
        index[position] ^= mask
    else:
        data[position] ^= mask
        b = next(b for b in range(parts.block_count) if parts.block_offsets[b] <= position < parts.block_offsets[b + 1])
        frame = data[parts.block_offsets[b] : parts.block_offsets[b + 1]]
        struct.pack_into("<I", index, len(index) - 4 * (parts.block_count - b), spec_reader.crc32c(frame))
    edge = min(4096, len(data))
    struct.pack_into("<III", index, DATA_CRC32C, spec_reader.crc32c(data), spec_reader.crc32c(data[:edge] + data[len(data) - edge :]),
                     spec_reader.crc32c(index[64:]))
    struct.pack_into("<I", index, 60, spec_reader.crc32c(index[:60]))
    return ShardBytes(bytes(index), bytes(data))


def _spec_outcome(prefix: str) -> tuple:
    """"open", or every read's record (None when refused) and the records full verification reports (None: passes)."""
    try:
        shard = spec_reader.open_shard(prefix)
    except spec_reader.SpecError:
        return ("open",)
    reads = []
    for i in range(len(shard)):
        try:
            reads.append(_text(spec_reader.notation(shard.record(i))))
        except spec_reader.SpecError:
            reads.append(None)
    try:
        shard.verify()
    except spec_reader.VerificationFailed as failure:
        return reads, sorted(failure.damaged)
    return reads, None


def _varstore_outcome(prefix: str) -> tuple:
    try:
        reader = varstore.open(prefix)
    except varstore.VarstoreError:
        return ("open",)
    with reader:
        reads = []
        for i in range(len(reader)):
            try:
                reads.append(_text(to_json(reader[i])))
            except varstore.VarstoreError:
                reads.append(None)
        try:
            reader.verify()
        except varstore.CorruptRecordError as failure:
            return reads, sorted(failure.records)
        except varstore.VarstoreError:
            return reads, []
    return reads, None


@st.composite
def _flips(draw) -> tuple[BlockShardParts, str, int, int]:
    parts = FLIP_BASES[draw(st.sampled_from(sorted(FLIP_BASES)))]()
    file = draw(st.sampled_from(["index", "data"]))
    size = len(assemble(parts).index) if file == "index" else len(parts.data)
    return parts, file, draw(st.integers(0, size - 1)), draw(st.integers(1, 255))


@needs_varstore_reader
def test_after_a_byte_flip_both_readers_agree_on_every_read_and_every_damaged_record(tmp_path_factory):
    @settings(max_examples=300)
    @given(flip=_flips())
    def agree(flip):
        prefix = _write(tmp_path_factory.mktemp("s"), _flipped(*flip))
        assert _varstore_outcome(prefix) == _spec_outcome(prefix)

    agree()


def test_a_byte_flip_is_refused_or_read_by_the_spec_reader_without_any_other_error(tmp_path_factory):
    """The spec-only reader itself never fails but by SpecError, whatever byte changed (its own robustness)."""

    @settings(max_examples=300)
    @given(flip=_flips())
    def refused_or_read(flip):
        outcome = _spec_outcome(_write(tmp_path_factory.mktemp("s"), _flipped(*flip)))
        assert outcome == ("open",) or len(outcome[0]) == flip[0].record_count

    refused_or_read()
