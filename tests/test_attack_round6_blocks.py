"""Round 6 of attacks, on shards of compressed blocks (format 3.0, spec/FORMAT.md §1.7): forged block tables and
frames judged by varstore and the spec-only reader on every way of reading, a dictionary zstd cannot load, token
windows over compressed shards, writers killed mid-write and decoding bombs. Each test names what it proves."""

from __future__ import annotations

import resource
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import varstore
from varstore.format.checksum import crc32c
from varstore.format.notation import to_json

from . import spec_reader
from .spec_writer import Map, ShardBytes, msgpack_bytes
from .spec_writer_blocks import BlockShardParts, assemble, block_parts, frame_of
from .test_spec_blocks import _base, _dictionary, _spec_outcome, _text, _varstore_outcome, _with_frame, _write

pytest.importorskip("zstandard")


def _damaged_dictionary(prefix: Path) -> None:
    """Keep the dictionary section's magic and ID (what open checks, §1.6) but zero the rest, which zstd cannot load
    as a dictionary; its CRC32C, the body's and the header's are made right again."""
    index = bytearray(Path(f"{prefix}.index").read_bytes())
    metadata_size, dictionary_size = struct.unpack_from("<Q", index, 32)[0], struct.unpack_from("<I", index, 52)[0]
    start = -(-(64 + metadata_size) // 8) * 8
    index[start + 8 : start + dictionary_size] = bytes(dictionary_size - 8)
    struct.pack_into("<I", index, 56, crc32c(bytes(index[start : start + dictionary_size])))
    struct.pack_into("<I", index, 48, crc32c(bytes(index[64:])))
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    Path(f"{prefix}.index").write_bytes(bytes(index))


_LINES = [f"record {i}: word{i % 17} and {i * 7 % 101} more words" for i in range(3000)]


@pytest.mark.parametrize("codec", ["str", "bytes", "msgpack"])
@pytest.mark.parametrize("compression", ["zstd-dict-blocks", "zstd-dict"])
def test_a_dictionary_zstd_cannot_load_opens_and_every_read_and_verify_refuse_it_by_record(codec, compression, tmp_path):
    """§1.6: a dictionary whose magic and ID pass is found invalid "when a frame is decoded with it (a read of that
    record fails)". Found: zstandard's ZstdError escaped (at open for str and bytes, through the C slicers' context;
    at every read and verify otherwise) instead of a CorruptRecordError."""
    records = [line.encode() for line in _LINES] if codec == "bytes" else _LINES
    prefix = tmp_path / "s"
    with varstore.Writer(prefix, codec, compression=compression) as writer:
        writer.extend(records)
    _damaged_dictionary(prefix)
    with pytest.raises(spec_reader.SpecError, match="does not decode"):
        spec_reader.open_shard(str(prefix)).record(3)
    with varstore.open(prefix) as reader:
        with pytest.raises(varstore.CorruptRecordError, match=r"record 3\b.*dictionary") as refused:
            reader[3]
        assert refused.value.records == [3] and str(prefix) in str(refused.value)
        with pytest.raises(varstore.CorruptRecordError, match="dictionary"):
            reader.get_batch([1, 2000])
        with pytest.raises(varstore.CorruptRecordError, match="dictionary"):
            reader.get_batch_flat([2000, 1])
        with pytest.raises(varstore.CorruptRecordError) as verified:
            reader.verify()
        assert verified.value.records == list(range(len(records)))


def test_the_c_slicers_decompress_of_an_unloadable_dictionary_raises_its_value_error():
    """What the C slicers call (`thread_decompress`) raises the dictionary's ValueError, so they decline to the
    Python path, which names the record (it first raised a NameError: the closure outlived `except ... as`)."""
    from varstore.format import compression

    dictionary = compression.DICTIONARY_MAGIC + struct.pack("<I", 5) + bytes(100)
    decompress = compression.Decompressor(compression.ZSTD_DICT_BLOCKS, dictionary).thread_decompress()
    with pytest.raises(ValueError, match="dictionary is no zstd dictionary"):
        decompress(b"", 0)

# -- token windows over compressed shards --------------------------------------------------------------------


def _documents() -> list[np.ndarray]:
    generator = np.random.default_rng(0)
    return [generator.integers(0, 50, int(generator.integers(1, 400))).astype(np.uint16) for _ in range(300)]


@pytest.mark.parametrize("compression", ["zstd-blocks", "zstd"])
def test_token_windows_refuse_a_compressed_shard_when_made_not_with_a_wrong_length(compression, tmp_path):
    """Found: TokenWindowDataset took a compressed shard's token count from its stored (compressed) data size, so
    its len() was about half the windows, and only its reads failed (as_array's refusal)."""
    from varstore.torch import TokenWindowDataset

    with varstore.Writer(tmp_path / "s", "ndarray", dtype="<u2", compression=compression) as writer:
        writer.extend(_documents())
    with pytest.raises(varstore.RecordTypeError, match=f"token windows .*{compression}"):
        TokenWindowDataset(tmp_path / "s", 16)


@pytest.mark.parametrize("compression", ["zstd-blocks", "zstd"])
def test_token_windows_over_a_remote_compressed_dataset_refuse_its_first_read(compression, s3_server, tmp_path, monkeypatch):
    """Found: over object storage, a 2.x dataset's windows were cut at its stored frames' offsets (a ValueError of
    numpy, or wrong tokens) and a 3.x dataset's windows stopped at half its tokens without a word."""
    from varstore.remote.filesystems import open_filesystem
    from varstore.torch import TokenWindowDataset

    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "node-cache"))
    with varstore.ShardedWriter(tmp_path / "local", "ndarray", dtype="<u2", compression=compression) as writer:
        writer.extend(_documents())
    url = f"s3://{s3_server.new_bucket()}/set"
    filesystem, path = open_filesystem(url, s3_server.storage_options)
    for file in sorted((tmp_path / "local").iterdir()):
        filesystem.put_file(str(file), f"{path}/{file.name}")
    windows = TokenWindowDataset(url, 16, storage_options=s3_server.storage_options, cache_limit=1)
    with pytest.raises(varstore.RecordTypeError, match=f"shard-000000: token windows .*{compression}"):
        windows[0]


# -- forged block tables and frames: both readers agree, on every way of reading --------------------------------

# BASE (tests/test_spec_blocks.py): six records, offsets 0 5 11 18 23 32 39, in blocks of two: block_records [0, 2, 4, 6]
_BASE = _base()
_CONTENT_1 = b"charliedelta"  # block 1's decoded bytes
_SKIPPABLE = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"abcd"


def _frame(content: bytes, descriptor: int, window: bytes = b"", dictionary: bytes = b"", blocks: list[tuple[int, bytes]] | None = None) -> bytes:
    """A hand-made zstd frame (RFC 8878 §3.1.1) of `content`: magic, `descriptor`, the window byte, a Dictionary_ID,
    a 4-byte Frame_Content_Size, then `blocks` ((block header u24, body) each; by default one last raw block)."""
    blocks = blocks if blocks is not None else [(len(content) << 3 | 1, content)]
    body = b"".join(struct.pack("<I", header)[:3] + payload for header, payload in blocks)
    return b"\x28\xb5\x2f\xfd" + bytes([descriptor]) + window + dictionary + struct.pack("<I", len(content)) + body


def _in_block_1(frame: bytes, parts: BlockShardParts = _BASE) -> ShardBytes:
    return assemble(_with_frame(parts, 1, frame))


def _table(**fields) -> ShardBytes:
    return assemble(replace(_BASE, **fields))


def _zero_record_block() -> ShardBytes:
    """A block of no records (block_records [0, 2, 2, 4, 6]) between blocks 0 and 1: every read finds its block,
    only verification sees block_records not increasing strictly."""
    offsets, checksums = _BASE.block_offsets, _BASE.block_checksums
    return _table(block_offsets=[0, offsets[1], offsets[1], offsets[2], offsets[3]], block_records=[0, 2, 2, 4, 6],
                  block_checksums=[checksums[0], crc32c(b""), *checksums[1:]], block_count=4)


_TOP, _HALF = (1 << 64) - 1, 1 << 63
_O = _BASE.offsets
FORGERIES = {
    "a-block-of-no-records": _zero_record_block,
    "block-records-2-63": lambda: _table(block_records=[0, _HALF, 4, 6]),
    "block-records-2-64-minus-1": lambda: _table(block_records=[0, _TOP, 4, 6]),
    "block-records-decreasing": lambda: _table(block_records=[0, 4, 2, 6]),
    "block-offsets-2-63": lambda: _table(block_offsets=[0, _HALF, *_BASE.block_offsets[2:]]),
    "block-offsets-2-64-minus-1": lambda: _table(block_offsets=[0, _TOP, *_BASE.block_offsets[2:]]),
    "block-offsets-equal": lambda: _table(block_offsets=[0, _BASE.block_offsets[1], _BASE.block_offsets[1], _BASE.block_offsets[3]]),
    "block-offsets-past-the-data": lambda: _table(block_offsets=[0, _BASE.block_offsets[3] + 5, *_BASE.block_offsets[2:]]),
    "offset-2-63-inside-a-block": lambda: _table(offsets=[*_O[:3], _HALF, *_O[4:]]),
    "last-offset-2-64-minus-1": lambda: _table(offsets=[*_O[:-1], _TOP]),
    "offsets-decreasing-across-blocks": lambda: _table(offsets=[_O[0], _O[1], _O[2] - 3, *_O[3:]]),
    "offsets-all-0": lambda: _table(offsets=[0] * 7),
    "skippable-frame-before": lambda: _in_block_1(_SKIPPABLE + frame_of(_CONTENT_1, b"")),
    "skippable-frame-after": lambda: _in_block_1(frame_of(_CONTENT_1, b"") + _SKIPPABLE),
    "two-frames": lambda: _in_block_1(frame_of(_CONTENT_1[:3], b"") + frame_of(_CONTENT_1[3:], b"")),
    "no-bytes-at-all": lambda: _in_block_1(b""),
    "no-content-size": lambda: _in_block_1(bytes.fromhex("28b52ffd0000") + struct.pack("<I", 12 << 3 | 1)[:3] + _CONTENT_1),
    "window-8-mib": lambda: _in_block_1(_frame(_CONTENT_1, 0x80, bytes([13 << 3]))),
    "window-9-mib": lambda: _in_block_1(_frame(_CONTENT_1, 0x80, bytes([13 << 3 | 1]))),
    "window-2-41": lambda: _in_block_1(_frame(_CONTENT_1, 0x80, bytes([31 << 3 | 7]))),
    "dictionary-id-0-in-one-byte": lambda: _in_block_1(_frame(_CONTENT_1, 0x81, bytes([0]), b"\0")),
    "dictionary-id-5-in-a-plain-shard": lambda: _in_block_1(_frame(_CONTENT_1, 0x81, bytes([0]), b"\5")),
    "raw-block-past-a-1-kib-window": lambda: assemble(_with_frame(block_parts("bytes", {}, [b"a", bytes(2048), b"b"], [1, 1, 1]), 1,
                                                                  _frame(bytes(2048), 0x80, bytes([0])))),
    "raw-block-decodes-to-more": lambda: _in_block_1(_frame(_CONTENT_1, 0xA0, blocks=[(15 << 3 | 1, _CONTENT_1 + b"XYZ")])),
    "rle-block-decodes-to-more": lambda: _in_block_1(_frame(_CONTENT_1, 0xA0, blocks=[(112 << 3 | 2 << 1 | 1, b"a")])),
    "two-raw-blocks": lambda: _in_block_1(_frame(_CONTENT_1, 0xA0, blocks=[(5 << 3, _CONTENT_1[:5]), (7 << 3 | 1, _CONTENT_1[5:])])),
    "reserved-bit-set": lambda: _in_block_1(_frame(_CONTENT_1, 0xA8)),
    "unused-bit-set": lambda: _in_block_1(_frame(_CONTENT_1, 0xB0)),
    "content-checksum-wrong": lambda: _in_block_1(_frame(_CONTENT_1, 0xA4) + b"\0\0\0\0"),
    "msgpack-two-objects": lambda: assemble(block_parts("msgpack", {}, [msgpack_bytes(1), msgpack_bytes(1) + msgpack_bytes(2), msgpack_bytes(3)], [2, 1])),
    "msgpack-array-of-2-32-minus-1": lambda: assemble(block_parts("msgpack", {}, [msgpack_bytes(1), b"\xdd\xff\xff\xff\xff", msgpack_bytes(3)], [2, 1])),
    "msgpack-str-past-its-record": lambda: assemble(block_parts("msgpack", {}, [msgpack_bytes(Map((("a", 1),))), b"\xdb\x00\x00\x00\x04ab", b"\xa2cd"], [3])),
    "ndarray-partial-rows-in-one-block": lambda: assemble(block_parts("ndarray", {"dtype": "<i4", "shape": [2]}, [bytes(8), bytes(12), bytes(4), bytes(8)], [2, 2])),
    "ndarray-b1-byte-2": lambda: assemble(block_parts("ndarray", {"dtype": "|b1", "shape": []}, [b"\x01\x00", b"\x02", b"\x01"], [2, 1])),
    "str-character-split-across-records": lambda: assemble(block_parts("str", {}, [b"ok", "\u00e9".encode()[:1], "\u00e9".encode()[1:], b"x"], [3, 1])),
    "str-surrogate": lambda: assemble(block_parts("str", {}, [b"ok", b"\xed\xa0\x80", b"x"], [2, 1])),
    "dictionary-frame-in-a-plain-shard": lambda: _in_block_1(frame_of(_CONTENT_1, _dictionary(7))),
}


def _every_read_agrees_with_single_reads(prefix: str) -> list[tuple]:
    """Disagreements between single reads and every batch path (get_batch, get_batch_flat, iteration, slices) over
    all orders of pairs, duplicates and the whole shard: a batch holding a record a single read refuses must refuse,
    and a batch of records single reads return must return them."""
    found: list[tuple] = []
    try:
        reader = varstore.open(prefix)
    except varstore.VarstoreError:
        return found
    with reader:
        count = len(reader)
        singles = []
        for i in range(count):
            try:
                singles.append(_text(to_json(reader[i])))
            except varstore.VarstoreError:
                singles.append(None)
        batches = [list(range(count)), list(range(count))[::-1], [0, 0, count - 1, count - 1]]
        batches += [[i, j] for i in range(count) for j in range(count)]
        for batch in batches:
            expected = [singles[i] for i in batch]
            for name, read in (("get_batch", lambda b: [_text(to_json(r)) for r in reader.get_batch(b)]),
                               ("get_batch_flat", lambda b: (reader.get_batch_flat(b), expected)[1]),
                               ("fresh get_batch", lambda b: [_text(to_json(r)) for r in varstore.open(prefix).get_batch(b)])):
                try:
                    got = read(batch)
                except varstore.CorruptRecordError:
                    got = None
                if (got is None) != (None in expected) or (got is not None and got != expected):
                    found.append((name, batch, got, expected))
        for name, read in (("iteration", lambda: list(reader)), ("slice", lambda: reader[0:count])):
            try:
                read()
                refused = False
            except varstore.CorruptRecordError:
                refused = True
            if refused != (None in singles):
                found.append((name, refused))
    return found


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_table_or_frame_is_refused_where_the_spec_reader_refuses_it_by_every_way_of_reading(name, tmp_path):
    """Each forgery (every checksum but the one it targets made right) against the spec-only reader: the same
    open, the same single reads (the C `BlockSlicer` for bytes and str, Python for the rest), the same damaged
    records in verification; and every batch path agrees with the single reads."""
    prefix = _write(tmp_path, FORGERIES[name]())
    assert _varstore_outcome(prefix) == _spec_outcome(prefix)
    assert _every_read_agrees_with_single_reads(prefix) == []


def test_a_tiny_frame_declaring_a_4_gib_block_is_refused_without_touching_the_memory(tmp_path):
    """§1.7's bound lets a block declare 2^32 - 1 bytes; a 17-byte frame that declares so (in offsets, header and
    frame alike) is refused at the read, the batch and verification, and the pages zstd allocated are never
    written: the process's peak RSS grows by far less than the 4 GiB declared."""
    size = (1 << 32) - 1
    frames = [b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", size) + struct.pack("<I", 5 << 3 | 1)[:3] + b"abcde"] * 3
    parts = replace(block_parts("bytes", {}, [b"abcde"] * 3, [1, 1, 1]), data=b"".join(frames), offsets=[k * size for k in range(4)],
                    block_offsets=[17 * k for k in range(4)], block_checksums=[crc32c(frame) for frame in frames])
    prefix = _write(tmp_path, assemble(parts))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with varstore.open(prefix) as reader:
        for read in (lambda: reader[1], lambda: reader.get_batch([2, 0, 1]), reader.verify):
            with pytest.raises(varstore.CorruptRecordError, match="block"):
                read()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KiB: under 256 MiB
    with pytest.raises(spec_reader.SpecError, match="does not decode"):
        spec_reader.open_shard(prefix).record(1)


# -- writers ----------------------------------------------------------------------------------------------------


def test_a_block_writer_killed_before_any_os_call_leaves_whole_shards_and_resumes_to_the_same_dataset(memory_path):
    """ShardedWriter(compression="zstd-blocks") adds three spool files (the block table) to each shard: killed
    before each OS call of the run, it leaves only whole shards and no stray spool, and a resume completes the
    dataset as an uninterrupted run lays it out."""
    from .helpers_reliability import make_records
    from .test_crash import check_sharded_after_crash, kill_at_every_call, reference_layout, write_sharded

    options = dict(max_shard_bytes=3000, compression="zstd-blocks")
    records = make_records(11, 60, 300) + [bytes(range(256)) * 100] + make_records(12, 30)
    layout = reference_layout(memory_path, records, options)
    assert len(layout) >= 3
    kills = kill_at_every_call(memory_path, lambda directory: write_sharded(directory, records, options),
                               lambda directory: check_sharded_after_crash(directory, records, options, layout))
    assert kills >= 4 * len(layout)


def test_merge_of_1_x_2_x_and_3_x_datasets_reads_verifies_and_repairs_through_the_cli(tmp_path, capsys):
    """A dataset merged from uncompressed, zstd, zstd-blocks and zstd-dict-blocks datasets reads every record in
    order; a damaged 3.x shard fails verify, and repair --write drops it alone."""
    from .helpers_cli import run

    rows = [f"row {i} " * (i % 20) for i in range(2000)]
    sources = []
    for compression in (None, "zstd", "zstd-blocks", "zstd-dict-blocks"):
        sources.append(tmp_path / str(compression))
        with varstore.ShardedWriter(sources[-1], "str", compression=compression, max_shard_records=1000) as writer:
            writer.extend(rows)
    assert run(capsys, "merge", *sources, tmp_path / "merged")[0] == 0
    with varstore.open(tmp_path / "merged") as merged:
        assert [shard.header.version[0] for shard in (merged.shard(k) for k in range(8))] == [1, 1, 2, 2, 3, 3, 3, 3]
        assert list(merged) == rows * 4
        merged.verify()
    damaged = tmp_path / "merged" / "shard-000005.data"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    code, out, _ = run(capsys, "verify", tmp_path / "merged")
    assert code == 1 and "shard-000005" in out
    assert run(capsys, "repair", "--write", tmp_path / "merged")[0] == 0
    with varstore.open(tmp_path / "merged") as repaired:
        assert len(repaired) == 7000 and repaired[6999] == rows[-1]
        repaired.verify()


def test_a_block_writer_failing_any_os_call_with_enospc_raises_storage_error_and_leaves_no_spool(tmp_path):
    """A full disk at each write, pwrite, fsync, open, link or replace of a zstd-blocks Writer (whose block table
    is spooled to three more files): a StorageError and no file left, or a shard committed whole (the calls after
    the renames: the directory fsync, which the error then names, and the lock's best-effort ones)."""
    import errno
    import os

    from .helpers_reliability import assert_store_holds, count_calls, failing_call, make_records

    records = make_records(41, 300, 400)

    def work(directory: Path) -> None:
        with varstore.Writer(directory / "s", "bytes", compression="zstd-blocks") as writer:
            writer.extend(records)

    calls = count_calls(lambda: work(tmp_path / "counting"))
    assert calls.count("open") >= 7  # data, index, and the spools: checksums, sizes, the block table's three
    for name in sorted(set(calls)):
        for nth in range(1, calls.count(name) + 1):
            directory = tmp_path / f"{name}-{nth}"
            directory.mkdir()
            try:
                with failing_call(name, nth, errno.ENOSPC):
                    work(directory)
                committed = True
            except varstore.StorageError as failure:
                committed = "committed" in str(failure)
            if committed:
                assert_store_holds(directory / "s", records)
            else:
                assert os.listdir(directory) == [], (name, nth)


# -- object storage -------------------------------------------------------------------------------------------


def test_a_remote_dataset_batch_fetches_only_its_blocks_and_verify_names_a_damaged_blocks_records(s3_server, tmp_path, monkeypatch):
    """A batch over two remote shards (planned for the whole dataset, then handed each shard's frames) fetches the
    stored frames of the records' distinct blocks and nothing else; a block damaged at rest (its data and edge
    CRC32C made right again, so only its block checksum knows) is refused by name, and a remote verification
    lists exactly its records."""
    from .test_blocks_remote import RANGES_ONLY, _block_table, _data_gets, _records, _upload

    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "node-cache"))
    monkeypatch.setattr("varstore.shard.remote_shard.backoff_delay", lambda attempt: 0.0)
    records = _records(6000)
    with varstore.ShardedWriter(tmp_path / "local", "bytes", compression="zstd-blocks", max_shard_records=3000) as writer:
        writer.extend(records)
    (offsets_0, first_0), (offsets_1, first_1) = (_block_table(tmp_path / "local" / f"shard-00000{k}") for k in range(2))
    bucket = s3_server.new_bucket()
    _upload(s3_server, tmp_path / "local", f"s3://{bucket}/set")
    with varstore.open(f"s3://{bucket}/set", storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY) as dataset:
        dataset[0], dataset[3000]  # both shards open: their indexes are fetched before the count starts
        before = len(_data_gets(s3_server, bucket))
        wanted = [first_0[100] + 1, 3000 + first_1[50] + 2, first_0[10], 3000 + first_1[50]]
        assert dataset.get_batch(wanted) == [records[i] for i in wanted]
        expected = [(offsets_0[10], offsets_0[11]), (offsets_0[100], offsets_0[101]), (offsets_1[50], offsets_1[51])]
        assert sorted(_data_gets(s3_server, bucket)[before:]) == sorted(expected)

    data_path = tmp_path / "local" / "shard-000001.data"
    data = bytearray(data_path.read_bytes())
    data[offsets_1[7] + 20] ^= 0x40
    data_path.write_bytes(bytes(data))
    index = bytearray((tmp_path / "local" / "shard-000001.index").read_bytes())
    edge = min(4096, len(data))
    struct.pack_into("<II", index, 40, crc32c(bytes(data)), crc32c(bytes(data[:edge]) + bytes(data[len(data) - edge :])))
    struct.pack_into("<I", index, 60, crc32c(bytes(index[:60])))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "shard-000001.index").write_bytes(bytes(index))
    data_path.rename(damaged / "shard-000001.data")
    url = f"s3://{s3_server.new_bucket()}/one"
    _upload(s3_server, damaged, url)
    with varstore.open(f"{url}/shard-000001", storage_options=s3_server.storage_options, cache_limit=RANGES_ONLY) as shard:
        assert shard[first_1[8]] == records[3000 + first_1[8]]
        with pytest.raises(varstore.CorruptRecordError, match=f"record {first_1[7]}: block 7 checksum"):
            shard.get_batch([first_1[8], first_1[7]])
        with pytest.raises(varstore.CorruptRecordError) as verified:
            shard.verify()
        assert verified.value.records == list(range(first_1[7], first_1[8]))


# -- concurrency ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["bytes", "str", "msgpack"])
def test_threads_reading_one_shard_at_random_never_get_another_blocks_bytes(codec, tmp_path):
    """The opening thread reads through the C `BlockSlicer` (its own kept block; bytes and str), the others through
    the Python path (the shared last block), all at once: single reads, batches and slices at random over many
    small blocks, every record exactly right."""
    import threading

    rows = [f"row {i} " + "x" * (i * 37 % 300) for i in range(4000)]
    records = [row.encode() for row in rows] if codec == "bytes" else rows if codec == "str" else [{"i": i, "row": row} for i, row in enumerate(rows)]
    with varstore.Writer(tmp_path / "s", codec, compression="zstd-blocks") as writer:
        writer.extend(records)
    wrong: list[tuple] = []
    with varstore.open(tmp_path / "s") as reader:

        def read_at_random(seed: int) -> None:
            generator = np.random.default_rng(seed)
            for _ in range(600):
                kind, i = generator.integers(0, 3), int(generator.integers(0, len(records)))
                if kind == 0 and reader[i] != records[i]:
                    wrong.append(("single", i))
                elif kind == 1:
                    batch = generator.integers(0, len(records), int(generator.integers(1, 40)))
                    if reader.get_batch(batch) != [records[j] for j in batch]:
                        wrong.append(("batch", batch.tolist()))
                elif kind == 2 and reader[i : i + 30] != records[i : i + 30]:
                    wrong.append(("slice", i))

        threads = [threading.Thread(target=read_at_random, args=(seed,)) for seed in range(1, 4)]
        for thread in threads:
            thread.start()
        read_at_random(0)  # the opening thread, at the same time
        for thread in threads:
            thread.join()
    assert wrong == []


def test_forked_children_of_a_reader_that_has_read_read_every_record_right(tmp_path):
    """A reader opened and read in the parent (the C slicer's kept block, the zstd contexts, the last block) is
    inherited by forked children, which read every record right by every path and verify."""
    import os

    rows = [f"row {i} " + "y" * (i * 13 % 200) for i in range(3000)]
    with varstore.Writer(tmp_path / "s", "str", compression="zstd-dict-blocks") as writer:
        writer.extend(rows * 3)
    with varstore.open(tmp_path / "s") as reader:
        assert reader[4500] == rows[1500] and reader.get_batch([10, 8999]) == [rows[10], rows[2999]]
        children = []
        for seed in range(2):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                good = False
                try:
                    order = np.random.default_rng(seed).permutation(len(reader))
                    good = ([reader[int(i)] for i in order] == [rows[int(i) % 3000] for i in order]
                            and reader.get_batch(order[:500]) == [rows[int(i) % 3000] for i in order[:500]]
                            and list(reader) == rows * 3)
                    reader.verify()
                finally:
                    os._exit(0 if good else 1)
            children.append(pid)
        assert [os.waitpid(pid, 0)[1] for pid in children] == [0, 0]


# -- verification in chunks -------------------------------------------------------------------------------------

_CHUNKED = block_parts("bytes", {}, [bytes([i]) * (i % 7 + 1) for i in range(40)], [3, 1, 4, 2, 5, 1, 3, 2, 6, 3, 4, 2, 4])


def _chunked_damage() -> dict[str, ShardBytes]:
    """Every block checksum wrong in turn, block_records not increasing at every entry, an offset decreasing at
    every record: damage at, inside and across the boundaries of verification's chunks."""
    parts, damaged = _CHUNKED, {}
    for b in range(parts.block_count):
        damaged[f"checksum-{b}"] = assemble(replace(parts, block_checksums=[c ^ (k == b) for k, c in enumerate(parts.block_checksums)]))
    for k in range(1, parts.block_count):
        records = list(parts.block_records)
        records[k] = records[k - 1]
        damaged[f"records-equal-at-{k}"] = assemble(replace(parts, block_records=records))
    for i in range(2, parts.record_count):
        offsets = list(parts.offsets)
        offsets[i] = offsets[i - 1] - 1
        damaged[f"offset-decreasing-at-{i}"] = assemble(replace(parts, offsets=offsets))
    return damaged


@pytest.mark.parametrize(("blocks_at_once", "bytes_at_once", "offsets_at_once"), [(1, 1, 1), (3, 20, 4), (2, 64, 7)])
def test_verification_in_chunks_of_any_size_reports_what_the_spec_reader_reports(blocks_at_once, bytes_at_once, offsets_at_once,
                                                                                 tmp_path, monkeypatch):
    """Verification reads the table `_VERIFY_BLOCKS` entries and the data `_VERIFY_BYTES` at a time: with chunks of a
    block or a byte, or of sizes that cut runs anywhere, every damage is found for the same records as the spec-only
    reader finds (and every read refused as it refuses)."""
    from varstore.shard import blocks, index

    monkeypatch.setattr(blocks, "_VERIFY_BLOCKS", blocks_at_once)
    monkeypatch.setattr(blocks, "_VERIFY_BYTES", bytes_at_once)
    monkeypatch.setattr(index, "_VERIFY_RECORDS", offsets_at_once)
    for name, shard in _chunked_damage().items():
        directory = tmp_path / name
        directory.mkdir()
        prefix = _write(directory, shard)
        assert _varstore_outcome(prefix) == _spec_outcome(prefix), name


def test_verifying_a_table_out_of_order_checks_a_damaged_blocks_frame_once_not_once_per_record(tmp_path, monkeypatch):
    """With the block table out of order, verification reads every record as a read would; found: a damaged block's
    frame was checksummed again for each of its records, N times its stored size (1M records in a 64 MiB block:
    hours). Its first record's refusal now stands for the rest of the block's."""
    from varstore.shard import blocks

    count = 300
    payloads = [bytes([k % 251]) * 1000 for k in range(count)]
    parts = block_parts("bytes", {}, payloads, [count])
    end = parts.block_offsets[-1]
    # a last block of no records: block_records [0, N, N] does not increase strictly, so the table is out of order
    parts = replace(parts, block_offsets=[0, end, end], block_records=[0, count, count],
                    block_checksums=[parts.block_checksums[0] ^ 1, crc32c(b"")], block_count=2)
    prefix = _write(tmp_path, assemble(parts))
    checked = []
    real_crc32c = blocks.crc32c
    monkeypatch.setattr(blocks, "crc32c", lambda data, *crc: (checked.append(len(memoryview(data))), real_crc32c(data, *crc))[1])
    with varstore.open(prefix) as reader, pytest.raises(varstore.CorruptRecordError) as refused:
        reader.verify()
    assert refused.value.records == list(range(count))
    assert checked.count(end) <= 2  # the frame checked once (the data file's CRC32C reads it too: it is its whole)
    failure = _spec_outcome(prefix)
    assert failure[1] == list(range(count))
