"""Forged and damaged offsets and payloads: verify() refuses every record a read would refuse, record_sizes()
checks offsets as reads do, and every way of reading agrees with single reads."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from varstore.format import header as fmt
from varstore.format.checksum import crc32c

from .helpers_reliability import reseal_body
from varstore.format.metadata import encode_metadata

CODEC_IDS = {"bytes": 0, "str": 1, "ndarray": 2, "msgpack": 3}


def forge_shard(prefix, codec: str, data: bytes, offsets: list[int], *, checksums: bool, params: Any = None) -> str:
    """Write a shard of `data` cut at `offsets` with every checksum consistent, as a buggy or hostile writer that
    recomputes them would: only the format's structural rules can catch what is wrong."""
    data_path, index_path = fmt.shard_paths(str(prefix))
    metadata = encode_metadata(params or {}, {})
    record_crcs = [crc32c(data[start:end]) for start, end in zip(offsets, offsets[1:])] if checksums else []
    body = (metadata + bytes(fmt.align8(fmt.HEADER_SIZE + len(metadata)) - fmt.HEADER_SIZE - len(metadata))
            + struct.pack(f"<{len(offsets)}Q", *offsets) + struct.pack(f"<{len(record_crcs)}I", *record_crcs))
    (_, head_length), (tail_start, tail_length) = fmt.edge_ranges(len(data))
    header = fmt.Header(
        CODEC_IDS[codec], fmt.FLAG_RECORD_CHECKSUMS if checksums else 0, len(offsets) - 1, len(data), len(metadata),
        crc32c(data), fmt.edge_crc32c(data[:head_length], data[tail_start : tail_start + tail_length]), crc32c(body),
    )
    with open(index_path, "wb") as file:
        file.write(header.pack() + body)
    with open(data_path, "wb") as file:
        file.write(data)
    return str(prefix)


def joined(payloads: list[bytes]) -> tuple[bytes, list[int]]:
    return b"".join(payloads), np.concatenate([[0], np.cumsum([len(p) for p in payloads])]).astype(int).tolist()


UINT16 = {"dtype": "<u2", "shape": []}


def single_reads_that_fail(reader) -> list[int]:
    failing = []
    for index in range(len(reader)):
        try:
            reader[index]
        except varstore.CorruptRecordError:
            failing.append(index)
    return failing


# -- verify checks every rule a read checks ----------------------------------------------------------------


@pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])
def test_verify_refuses_array_offsets_off_row_boundaries_naming_both_records(tmp_path, checksums):
    data = np.arange(8, dtype="<u2").tobytes()
    path = forge_shard(tmp_path / "tokens", "ndarray", data, [0, 7, 16], checksums=checksums, params=UINT16)
    reader = varstore.open(path)
    assert single_reads_that_fail(reader) == [0, 1]
    with pytest.raises(varstore.CorruptRecordError, match=r"tokens\.data: 2 records are not on 2-byte row boundaries: 0, 1") as caught:
        reader.verify()
    assert caught.value.records == [0, 1]


def test_verify_lists_every_off_row_record_among_many(tmp_path):
    offsets = list(range(0, 2 * 10_000 + 1, 2))
    offsets[5000] += 1  # records 4999 and 5000
    offsets[9000] -= 1  # records 8999 and 9000
    path = forge_shard(tmp_path / "tokens", "ndarray", bytes(2 * 10_000), offsets, checksums=True, params=UINT16)
    with pytest.raises(varstore.CorruptRecordError) as caught:
        varstore.open(path).verify()
    assert caught.value.records == [4999, 5000, 8999, 9000]


@pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])
def test_verify_refuses_str_records_that_are_not_utf8_even_when_the_file_as_a_whole_is(tmp_path, checksums):
    # "é" is two bytes: cutting between them leaves the whole data file valid UTF-8 and both records not.
    data, offsets = joined(["plain".encode(), "é".encode(), "also plain".encode(), b"\xff\xfe", "ok".encode()])
    offsets[2] -= 1
    path = forge_shard(tmp_path / "text", "str", data, offsets, checksums=checksums)
    reader = varstore.open(path)
    assert single_reads_that_fail(reader) == [1, 2, 3]
    with pytest.raises(varstore.CorruptRecordError, match=r"3 records are not valid UTF-8: 1, 2, 3") as caught:
        reader.verify()
    assert caught.value.records == [1, 2, 3]


@pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])
def test_verify_refuses_msgpack_records_the_codec_cannot_decode(tmp_path, checksums):
    payloads = [
        msgpack.packb({"ok": 1}),
        b"\xc1",  # a byte msgpack never uses
        msgpack.packb([1, 2]) + b"\x01",  # two objects in one record
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion elements, refused by the bounded pre-walk
        msgpack.packb(msgpack.ExtType(1, b"\x03<u2\x01" + struct.pack("<Q", 5) + b"\x00\x00")),  # shape does not fit
        msgpack.packb(msgpack.ExtType(9, b"")),  # an extension type the format does not define
        msgpack.packb("fine"),
    ]
    path = forge_shard(tmp_path / "samples", "msgpack", *joined(payloads), checksums=checksums)
    reader = varstore.open(path)
    assert single_reads_that_fail(reader) == [1, 2, 3, 4, 5]
    with pytest.raises(varstore.CorruptRecordError, match=r"5 records do not decode as msgpack: 1, 2, 3, 4, 5") as caught:
        reader.verify()
    assert caught.value.records == [1, 2, 3, 4, 5]


def test_verify_reports_checksum_and_decode_failures_together(tmp_path):
    data, offsets = joined([b"\x93\x01\x02\x03", b"\xc1", b"\x01"])
    path = forge_shard(tmp_path / "samples", "msgpack", data, offsets, checksums=True)
    index = bytearray((tmp_path / "samples.index").read_bytes())
    index[-12] ^= 0xFF  # record 0's stored checksum: the record decodes, its checksum fails
    (tmp_path / "samples.index").write_bytes(reseal_body(bytes(index)))
    with pytest.raises(varstore.CorruptRecordError, match="1 record fails its checksum: 0; 1 record does not decode") as caught:
        varstore.open(path).verify()
    assert caught.value.records == [0, 1]


@pytest.mark.parametrize("codec, records", [
    ("str", ["", "héllo", "wörld " * 1000, "", "☃" * 3000, "x"]),
    ("msgpack", [{"a": [1, 2.5, None]}, "", np.arange(3, dtype=np.uint16), {"nested": {"deep": [b"\x00"]}}]),
    ("ndarray", [np.zeros((0, 3), np.float32), np.ones((5, 3), np.float32)]),
])
def test_verify_passes_every_valid_shard(tmp_path, codec, records):
    options = {"dtype": "float32", "shape": [3]} if codec == "ndarray" else {}
    for checksums in (True, False):
        with varstore.Writer(tmp_path / f"ok-{checksums}", codec=codec, checksums=checksums, **options) as writer:
            writer.extend(records)
        varstore.open(tmp_path / f"ok-{checksums}").verify()


# -- record_sizes checks the offsets --------------------------------------------------------------------------


def test_record_sizes_of_reversed_offsets_names_the_file_and_every_bad_record(tmp_path):
    path = forge_shard(tmp_path / "docs", "bytes", bytes(40), [0, 10, 5, 20, 15, 40], checksums=False)
    reader = varstore.open(path)
    with pytest.raises(varstore.CorruptRecordError, match=r"docs\.index: record 1 has offsets \[10, 5\).*2 records have such offsets: 1, 3") as caught:
        reader.record_sizes()
    assert caught.value.records == [1, 3]
    with pytest.raises(varstore.CorruptRecordError) as caught:
        reader.verify()
    assert caught.value.records == [1, 3]


def test_record_sizes_of_offsets_past_the_data_file_is_a_corrupt_record(tmp_path):
    path = forge_shard(tmp_path / "docs", "bytes", bytes(40), [0, 10, 2**63, 40], checksums=False)
    with pytest.raises(varstore.CorruptRecordError, match=r"record 1 has offsets \[10, 9223372036854775808\)") as caught:
        varstore.open(path).record_sizes()
    assert caught.value.records == [1, 2]


def test_record_sizes_of_array_offsets_off_row_boundaries_is_a_corrupt_record(tmp_path):
    path = forge_shard(tmp_path / "rows", "ndarray", bytes(16), [0, 4, 16], checksums=False, params={"dtype": "<i8", "shape": []})
    with pytest.raises(varstore.CorruptRecordError, match="row boundaries") as caught:
        varstore.open(path).record_sizes()
    assert caught.value.records == [0]


# -- the boundary index ----------------------------------------------------------------------------------------


def test_get_batch_of_the_count_itself_is_a_record_index_error(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend([b"a", b"b", b"c"])
    with varstore.ShardedWriter(tmp_path / "dataset", max_shard_records=2) as writer:
        writer.extend([b"a", b"b", b"c"])
    for store in (varstore.open(tmp_path / "docs"), varstore.open(tmp_path / "dataset")):
        for read in (store.get_batch, store.get_batch_flat):
            assert len(read([2, -3])) == 2
            for boundary in (3, -4):
                with pytest.raises(varstore.RecordIndexError, match=f"record {boundary} is out of range for 3 records"):
                    read([0, boundary])


# -- every way of reading agrees ------------------------------------------------------------------------------


def _attempt(read):
    try:
        return read()
    except varstore.CorruptRecordError as error:
        return error


def _payload(record: Any) -> bytes:
    return record.tobytes() if isinstance(record, np.ndarray) else bytes(record)


@st.composite
def forged_offsets(draw) -> tuple[str, bytes, list[int]]:
    codec = draw(st.sampled_from(["bytes", "ndarray"]))
    count = draw(st.integers(1, 12))
    data = bytes(range(256))[: 2 * draw(st.integers(count, 100))]
    inner = sorted(draw(st.lists(st.integers(0, len(data)), min_size=count - 1, max_size=count - 1)))
    offsets = [0, *inner, len(data)]
    for _ in range(draw(st.integers(1, 3))):  # then damage some: swaps, off-row values, values past the end
        position = draw(st.integers(1, count - 1)) if count > 1 else 1
        offsets[position] = draw(st.integers(0, len(data) + 3) | st.sampled_from([2**63, 2**64 - 1]))
    return codec, data, offsets


@settings(max_examples=150, deadline=None)
@given(forged=forged_offsets(), checksums=st.booleans())
def test_forged_offsets_read_the_same_way_through_every_path(tmp_path_factory, forged, checksums):
    codec, data, offsets = forged
    path = forge_shard(tmp_path_factory.mktemp("forged") / "shard", codec, data, offsets, checksums=checksums,
                       params=UINT16 if codec == "ndarray" else None)
    try:
        reader = varstore.open(path)
    except varstore.FormatError:
        return  # offsets[N] no longer equals the data size
    singles = [_attempt(lambda index=index: reader[index]) for index in range(len(reader))]
    every_single_reads = not any(isinstance(single, Exception) for single in singles)
    wanted = [_payload(single) for single in singles] if every_single_reads else None
    whole = {
        "iteration": _attempt(lambda: [_payload(record) for record in reader]),
        "slice": _attempt(lambda: [_payload(record) for record in reader[:]]),
        "batch": _attempt(lambda: [_payload(record) for record in reader.get_batch(range(len(reader)))]),
        "flat batch": _attempt(lambda: _flat_payloads(reader.get_batch_flat(range(len(reader))))),
        "iter_flat": _attempt(lambda: [p for batch in reader.iter_flat(3) for p in _flat_payloads(batch)]),
    }
    for name, result in whole.items():
        assert (result == wanted) if every_single_reads else isinstance(result, varstore.CorruptRecordError), name
    verified = _attempt(reader.verify)
    assert every_single_reads or isinstance(verified, varstore.CorruptRecordError), "verify passed a record no read returns"
    sizes = _attempt(reader.record_sizes)
    if not isinstance(sizes, Exception):
        assert sizes.tolist() == np.diff(np.array(offsets, dtype=object)).tolist()
        assert all(isinstance(single, Exception) or len(_payload(single)) == size for single, size in zip(singles, sizes))
    elif every_single_reads:
        pytest.fail(f"record_sizes failed where every read succeeds: {sizes}")
    if codec == "ndarray":
        rows = reader.as_array()
        assert rows.tobytes() == data
        for index, single in enumerate(singles):
            if not isinstance(single, Exception):
                assert np.shares_memory(single, rows) or single.size == 0
                assert single.tobytes() == rows[offsets[index] // 2 : offsets[index + 1] // 2].tobytes()


def _flat_payloads(batch) -> list[bytes]:
    raw = batch.values.tobytes()
    row_size = batch.values.itemsize * int(np.prod(batch.values.shape[1:]))
    bounds = batch.offsets.tolist()
    return [raw[start * row_size : end * row_size] for start, end in zip(bounds, bounds[1:])]
