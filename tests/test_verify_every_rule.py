"""Full verification (§1.3) checks every rule a read checks, for every record, and data_crc32c always: every kind
of damaged record is refused alike by every read that decodes it and by verify, with or without record checksums."""

from __future__ import annotations

import re
import struct

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format import header as fmt

from .helpers_reliability import header_field, read_shard_files, rewrite_header, write_shard_files
from .test_reader_damage import forge_shard, joined

CHECKSUMS = pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])


@CHECKSUMS
def test_wrong_header_data_crc32c_opens_and_reads_but_fails_verify_naming_it(tmp_path, checksums):
    """Regression: with record checksums, verify checked only those, so a wrong data_crc32c passed."""
    prefix = tmp_path / "docs"
    with varstore.Writer(prefix, checksums=checksums) as writer:
        writer.extend([b"first", b"second", b"third"])
    index, data = read_shard_files(prefix)
    wrong = header_field(index, "data_crc32c") ^ 1
    write_shard_files(prefix, rewrite_header(index, data_crc32c=wrong), data)  # header_crc32c made to match
    with varstore.open(prefix, verify_reads=checksums) as reader:
        assert list(reader) == [b"first", b"second", b"third"]
        with pytest.raises(varstore.CorruptRecordError, match=rf"data checksum is 0x[0-9a-f]{{8}}, expected {wrong:#010x} "
                           r"\(the header's data_crc32c\)") as caught:
            reader.verify()
    assert caught.value.records == []


def bool_array_payload(values: bytes, dtype: bytes = b"|b1") -> bytes:
    """A msgpack extension-type-1 array of 1-D shape holding the raw element bytes `values` (§2.2)."""
    head = bytes([len(dtype)]) + dtype + b"\x01" + struct.pack("<Q", len(values))
    return msgpack.packb(msgpack.ExtType(1, head + values))


# (codec, codec parameters, data, offsets, the damaged records, what verify says of them)
DAMAGED = {
    "ndarray-offset-off-row": (
        "ndarray", {"dtype": "<u2", "shape": []}, bytes(8), [0, 2, 5, 8], [1, 2], "on 2-byte row boundaries"),
    "ndarray-b1-value-2": (
        "ndarray", {"dtype": "|b1", "shape": []}, b"\x01\x00\x02\x01\x00", [0, 2, 3, 5], [1], "|b1 bytes other than 0 or 1"),
    "ndarray-b1-rows-value-255": (
        "ndarray", {"dtype": "|b1", "shape": [2]}, b"\x01\x00\x00\x01\x01\xff", [0, 2, 4, 6], [2], "|b1 bytes other than 0 or 1"),
    "str-invalid-utf8": ("str", {}, *joined([b"ok", b"\xc3", b"\xa9", "é".encode()]), [1, 2], "valid UTF-8"),
    "msgpack-undecodable": (
        "msgpack", {}, *joined([msgpack.packb({"a": 1}), b"\xc1", msgpack.packb([1]) + b"\x00"]), [1, 2],
        "decode as msgpack"),
    "msgpack-b1-value-2": (
        "msgpack", {}, *joined([bool_array_payload(b"\x00\x01"), bool_array_payload(b"\x01\x02"), msgpack.packb(None)]), [1],
        "decode as msgpack"),
}


def decoding_reads(reader, index: int) -> dict:
    """Every way of reading record `index`, flat reads included (they check each record as a read does); as_array
    reads all rows regardless of offsets, so only the |b1 rule applies to it."""
    reads = {
        "single": lambda: reader[index],
        "batch": lambda: reader.get_batch([index]),
        "slice": lambda: reader[index : index + 1],
        "iteration": lambda: list(reader),
        "flat": lambda: reader.get_batch_flat([index]),
        "flat_iteration": lambda: list(reader.iter_flat(2)),
    }
    if reader.codec == "ndarray" and reader.dtype == np.bool_:
        reads["as_array"] = reader.as_array
    return reads


READS_OF_ALL = ("iteration", "flat_iteration", "as_array")  # these name the first damaged record of the shard


@CHECKSUMS
@pytest.mark.parametrize("case", DAMAGED)
def test_every_read_and_verify_refuse_the_same_damaged_records(tmp_path, case, checksums):
    codec, params, data, offsets, damaged, rule = DAMAGED[case]
    path = forge_shard(tmp_path / "shard", codec, data, offsets, checksums=checksums, params=params)
    with varstore.open(path) as reader:
        for index in range(len(reader)):
            for name, read in decoding_reads(reader, index).items():
                if index in damaged:
                    named = min(damaged) if name in READS_OF_ALL else index
                    with pytest.raises(varstore.CorruptRecordError, match=rf"record {named}\b"):
                        read()
                elif name in ("single", "batch", "slice", "flat"):
                    read()  # a good record reads
        with pytest.raises(varstore.CorruptRecordError, match=rf"{len(damaged)} records? [a-z ]*{re.escape(rule)}: ") as caught:
            reader.verify()
    assert caught.value.records == damaged


def test_index_smaller_than_offsets_start_plus_8_is_refused_naming_that_size(tmp_path):
    """§1.3 step 6 first checks index size >= offsets_start + 8, so nothing after it computes a negative room."""
    prefix = tmp_path / "docs"
    with varstore.Writer(prefix, checksums=False, metadata={"pad": "x" * 30}) as writer:
        pass
    index, data = read_shard_files(prefix)
    offsets_start = fmt.align8(fmt.HEADER_SIZE + header_field(index, "metadata_size"))
    for size in (offsets_start + 7, offsets_start, fmt.HEADER_SIZE):
        write_shard_files(prefix, index[:size], data)
        with pytest.raises(varstore.FormatError, match=rf"docs\.index: index file is {size} bytes, smaller than "
                           rf"offsets_start \+ 8 = {offsets_start + 8}"):
            varstore.open(prefix)
    write_shard_files(prefix, index, data)
    assert len(varstore.open(prefix)) == 0


def test_ndarray_data_file_not_a_whole_number_of_rows_is_refused_at_open_before_the_offsets(tmp_path):
    """§1.3 step 8: the row-size rule follows the data size, so it is what a 3-byte uint16 file breaks, whatever
    its offsets say."""
    path = forge_shard(tmp_path / "tokens", "ndarray", b"\x01\x00\x02", [0, 2, 2], checksums=True,
                       params={"dtype": "<u2", "shape": []})
    with pytest.raises(varstore.FormatError, match=r"tokens\.data: data file is 3 bytes, not a whole number of 2-byte rows"):
        varstore.open(path)
