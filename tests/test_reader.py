"""Reader behaviour: O(1) open, indexing rules, damage detection, pickling, threads, files over 4 GiB."""

from __future__ import annotations

import concurrent.futures
import os
import pickle
import struct

import numpy as np
import pytest

import varstore
from varstore.format import header as fmt
from varstore.format.checksum import crc32c
from varstore.format.metadata import encode_metadata


def make_shard(path, records, **options) -> str:
    with varstore.Writer(path, **options) as writer:
        writer.extend(records)
    return str(path)


def _bytes_read_while_opening(path, monkeypatch) -> int:
    reads = []
    real_pread = os.pread

    def counting_pread(fd, size, offset):
        data = real_pread(fd, size, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    varstore.open(path).close()
    monkeypatch.setattr(os, "pread", real_pread)
    return sum(reads)


def test_open_reads_the_same_bytes_whatever_the_record_count(tmp_path, monkeypatch):
    few = make_shard(tmp_path / "few", [b"x" * 1000] * 10)  # both data files exceed the two 4 KiB edges read at open
    many = make_shard(tmp_path / "many", [b"x"] * 200_000)
    assert _bytes_read_while_opening(few, monkeypatch) == _bytes_read_while_opening(many, monkeypatch)


@pytest.mark.parametrize("suffix", ["", ".index", ".data"])
def test_open_accepts_the_prefix_or_either_file(tmp_path, suffix):
    make_shard(tmp_path / "docs", [b"a"])
    assert varstore.open(f"{tmp_path / 'docs'}{suffix}")[0] == b"a"


def test_open_of_a_missing_path_names_what_it_looked_for(tmp_path):
    with pytest.raises(varstore.MissingFileError, match=r"nothing\.index"):
        varstore.open(tmp_path / "nothing")


def test_out_of_range_index_is_an_index_error_naming_the_count(tmp_path):
    reader = varstore.open(make_shard(tmp_path / "docs", [b"a", b"b"]))
    for index in (2, -3, 1 << 70):
        with pytest.raises(varstore.RecordIndexError, match="out of range for 2 records"):
            reader[index]
    with pytest.raises(varstore.RecordIndexError, match="record 5 is out of range for 2 records"):
        reader.get_batch([0, 5])
    with pytest.raises(varstore.RecordTypeError):
        reader["0"]
    with pytest.raises(varstore.RecordTypeError):
        reader.get_batch([0.5])


def test_numpy_integers_index_like_ints(tmp_path):
    reader = varstore.open(make_shard(tmp_path / "docs", [b"a", b"b"]))
    assert reader[np.int64(1)] == b"b" and reader[np.uint8(0)] == b"a"
    assert reader.get_batch(np.array([1, 0], np.uint32)) == [b"b", b"a"]


def test_data_file_of_another_shard_with_the_same_size_is_refused(tmp_path):
    make_shard(tmp_path / "a", [b"aaaa", b"bb"])
    make_shard(tmp_path / "b", [b"cccc", b"dd"])
    os.replace(tmp_path / "b.data", tmp_path / "a.data")
    with pytest.raises(varstore.FormatError, match="does not match its index"):
        varstore.open(tmp_path / "a")


def test_truncated_data_file_is_refused_at_open(tmp_path):
    make_shard(tmp_path / "docs", [b"abcdef"])
    os.truncate(tmp_path / "docs.data", 3)
    with pytest.raises(varstore.FormatError, match=r"docs\.data: data file is 3 bytes but its index expects 6"):
        varstore.open(tmp_path / "docs")


PADDING = bytes(fmt.EDGE_SIZE)  # keeps the damaged byte out of the first and last 4 KiB checked at open


def _flip_data_byte(path, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        original = file.read(1)
        file.seek(position)
        file.write(bytes([original[0] ^ 0x01]))


def test_flipped_byte_in_the_first_or_last_4_kib_is_refused_at_open(tmp_path):
    path = make_shard(tmp_path / "docs", [b"first", PADDING, PADDING, b"last"])
    _flip_data_byte(tmp_path / "docs.data", 2)
    with pytest.raises(varstore.FormatError, match="does not match its index"):
        varstore.open(path)


def test_flipped_payload_byte_fails_verify_and_verify_reads(tmp_path):
    path = make_shard(tmp_path / "docs", [PADDING, b"second", b"third", PADDING])
    _flip_data_byte(tmp_path / "docs.data", len(PADDING) + 1)
    reader = varstore.open(path)
    assert reader[1] == b"sdcond"  # without verify_reads a read is a slice: damage shows up in verify
    with pytest.raises(varstore.CorruptRecordError, match="1 record fails its checksum: 1") as caught:
        reader.verify()
    assert caught.value.records == [1]
    checked = varstore.open(path, verify_reads=True)
    assert checked[2] == b"third"
    for read in (lambda: checked[1], lambda: checked.get_batch([2, 1]), lambda: checked[0:3], lambda: list(checked), lambda: checked.get_batch_flat([1])):
        with pytest.raises(varstore.CorruptRecordError, match="record 1 checksum"):
            read()


def test_flipped_data_byte_without_record_checksums_fails_verify(tmp_path):
    path = make_shard(tmp_path / "docs", [PADDING, b"second", PADDING], checksums=False)
    _flip_data_byte(tmp_path / "docs.data", len(PADDING) + 1)
    with pytest.raises(varstore.CorruptRecordError, match="data checksum"):
        varstore.open(path).verify()
    with pytest.raises(varstore.FormatError, match="without record checksums"):
        varstore.open(path, verify_reads=True)


def _rewrite_offset(index_path, header: fmt.Header, position: int, value: int) -> None:
    """Change one offset and fix the body checksum, as a buggy or malicious writer would."""
    raw = bytearray(open(index_path, "rb").read())
    struct.pack_into("<Q", raw, header.offsets_start + 8 * position, value)
    fixed = fmt.Header(**{**header.__dict__, "body_crc32c": crc32c(bytes(raw[64:]))})
    raw[:64] = fixed.pack()
    open(index_path, "wb").write(raw)


def test_offsets_that_go_backwards_are_a_corrupt_record_naming_it(tmp_path):
    path = make_shard(tmp_path / "docs", [b"aaaa", b"bbbb", b"cccc"])
    _rewrite_offset(tmp_path / "docs.index", varstore.open(path).header, 2, 1)
    reader = varstore.open(path)
    assert reader[0] == b"aaaa"
    for read in (lambda: reader[1], lambda: reader.get_batch([0, 1]), lambda: reader[:], lambda: reader.get_batch_flat([1])):
        with pytest.raises(varstore.CorruptRecordError, match=r"record 1 has offsets \[4, 1\)"):
            read()
    for check in (reader.verify, reader.record_sizes):
        with pytest.raises(varstore.CorruptRecordError, match=r"docs\.index: record 1 has offsets \[4, 1\)") as caught:
            check()
        assert caught.value.records == [1]


def test_closed_reader_raises_closed_error_but_returned_arrays_stay_valid(tmp_path):
    reader = varstore.open(make_shard(tmp_path / "arrays", [np.arange(5, dtype=np.int64)], codec="ndarray", dtype="int64"))
    array = reader[0]
    reader.close()
    assert array.tolist() == [0, 1, 2, 3, 4]
    for read in (lambda: reader[0], lambda: reader.get_batch([0]), lambda: list(reader), lambda: reader.verify()):
        with pytest.raises(varstore.ClosedError):
            read()


def test_reader_pickles_by_path_and_maps_its_files_afresh(tmp_path):
    reader = varstore.open(make_shard(tmp_path / "docs", [os.urandom(1000) for _ in range(100)]))
    payload = pickle.dumps(reader)
    assert len(payload) < 500
    clone = pickle.loads(payload)
    assert clone._data_map is not reader._data_map
    assert len(clone) == 100
    assert clone.get_batch(range(100)) == reader.get_batch(range(100))
    assert clone[-1] == reader[-1]


def test_unpickling_a_reader_of_a_deleted_shard_fails_naming_it(tmp_path):
    payload = pickle.dumps(varstore.open(make_shard(tmp_path / "docs", [b"a"])))
    os.unlink(tmp_path / "docs.index")
    with pytest.raises(varstore.MissingFileError, match=r"docs\.index"):
        pickle.loads(payload)


def test_concurrent_reads_from_threads_are_correct(tmp_path):
    records = [os.urandom(n) for n in range(300)]
    reader = varstore.open(make_shard(tmp_path / "docs", records))

    def read_many(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            index = int(rng.integers(len(records)))
            batch = rng.integers(len(records), size=8)
            assert reader[index] == records[index]
            assert reader.get_batch(batch) == [records[i] for i in batch]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(read_many, seed) for seed in range(8)]:
            future.result(timeout=120)  # an exception in a thread fails the test


def test_record_past_4_gib_reads_correctly_from_a_sparse_data_file(tmp_path):
    hole = (5 << 30) - 3
    tail = b"tail record"
    data_path, index_path = fmt.shard_paths(str(tmp_path / "big"))
    with open(data_path, "wb") as file:
        file.truncate(hole)
        file.seek(hole)
        file.write(tail)
    size = hole + len(tail)
    with open(data_path, "rb") as file:
        head = file.read(fmt.EDGE_SIZE)
        file.seek(size - fmt.EDGE_SIZE)
        edge = crc32c(file.read(), crc32c(head))
    metadata = encode_metadata({}, {})
    body = metadata + bytes(fmt.align8(64 + len(metadata)) - 64 - len(metadata)) + struct.pack("<3Q", 0, hole, size)
    header = fmt.Header(0, 0, 2, size, len(metadata), 0, edge, crc32c(body))
    with open(index_path, "wb") as file:
        file.write(header.pack() + body)
    reader = varstore.open(tmp_path / "big")
    assert reader.offsets.tolist() == [0, hole, size]
    assert reader[1] == tail and reader[-1] == tail
    assert reader.get_batch([1]) == [tail]
    assert reader.get_batch_flat([1]).values.tobytes() == tail
    assert reader.record_sizes().tolist() == [hole, len(tail)]


def test_array_offsets_off_row_boundaries_are_a_corrupt_record(tmp_path):
    path = make_shard(tmp_path / "tokens", [np.arange(4, dtype=np.uint16)] * 2, codec="ndarray", dtype="uint16")
    _rewrite_offset(tmp_path / "tokens.index", varstore.open(path).header, 1, 7)
    reader = varstore.open(path)
    for read in (lambda: reader[0], lambda: reader.get_batch([1]), lambda: reader.get_batch_flat([0]), lambda: list(reader)):
        with pytest.raises(varstore.CorruptRecordError, match=r"record \d does not decode as ndarray: offsets \[\d+, \d+\) are not on 2-byte row"):
            read()


def test_array_data_file_that_is_not_whole_rows_is_refused_at_open(tmp_path):
    data_path, index_path = fmt.shard_paths(str(tmp_path / "frames"))
    make_shard(tmp_path / "frames", [np.zeros((1, 3), np.float32)], codec="ndarray", dtype="float32", shape=[3])
    header = varstore.open(tmp_path / "frames").header
    raw = bytearray(open(index_path, "rb").read())
    struct.pack_into("<Q", raw, header.offsets_start + 8, 8)
    body_crc = crc32c(bytes(raw[64:]))
    with open(data_path, "rb") as file:
        data = file.read(8)
    raw[:64] = fmt.Header(**{**header.__dict__, "data_size": 8, "body_crc32c": body_crc, "data_edge_crc32c": crc32c(data + data)}).pack()
    open(index_path, "wb").write(raw)
    open(data_path, "wb").write(data)
    with pytest.raises(varstore.FormatError, match="not a whole number of 12-byte rows"):
        varstore.open(tmp_path / "frames")


def test_a_negative_index_out_of_range_is_named_as_asked(tmp_path):
    with varstore.Writer(tmp_path / "s", "bytes") as writer:
        writer.extend([b"a", b"b"])
    with varstore.open(tmp_path / "s") as reader:
        with pytest.raises(varstore.RecordIndexError, match="record -3 is out of range for 2 records"):
            reader[-3]
    with varstore.ShardedWriter(tmp_path / "d", "bytes", max_shard_records=1) as writer:
        writer.extend([b"a", b"b"])
    with varstore.open(tmp_path / "d") as dataset:
        with pytest.raises(varstore.RecordIndexError, match="record -3 is out of range for 2 records"):
            dataset[-3]
