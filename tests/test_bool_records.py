"""A `|b1` element is one byte, 0 (false) or 1 (true) (spec §2.1, §2.2). numpy reads any non-zero byte as True,
so another byte value has no single meaning: writers refuse a bool array holding one (a bool view of other
bytes), and a record holding one is damaged on every way of reading it, in ndarray shards and in msgpack
array extensions alike."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format.codecs import MsgpackCodec, NdarrayCodec

from . import spec_reader
from .test_reader_damage import forge_shard
from .test_untrusted_input import array_extension, msgpack_shard

BOOLS = {"dtype": "|b1", "shape": []}
BOOL_ROWS = {"dtype": "|b1", "shape": [2]}


def bool_view(raw: bytes) -> np.ndarray:
    """What `np.frombuffer(raw, bool)` gives: a bool array whose bytes are `raw`, whatever they are."""
    return np.frombuffer(raw, np.bool_)


# -- writers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["ndarray append", "ndarray extend_flat", "msgpack array", "msgpack 0-d array"])
def test_bool_array_viewing_a_byte_other_than_0_or_1_is_refused_by_the_writer(tmp_path, store):
    bad = bool_view(b"\x01\x00\x02")
    codec = "msgpack" if store.startswith("msgpack") else "ndarray"
    with varstore.Writer(tmp_path / "flags", codec=codec, **({"dtype": "bool"} if codec == "ndarray" else {})) as writer:
        with pytest.raises(varstore.RecordTypeError, match=r"\|b1 element [02] is the byte 2"):
            if store == "ndarray append":
                writer.append(bad)
            elif store == "ndarray extend_flat":
                writer.extend_flat(bad, [1, 2])
            else:
                writer.append({"mask": bad if store == "msgpack array" else bad[2:].reshape(())})
        writer.append(bad.view(np.uint8) != 0)  # the normalisation the error message offers
    with varstore.open(tmp_path / "flags") as reader:
        assert len(reader) == 1
        reader.verify()


def test_bool_arrays_numpy_computes_are_stored_as_bytes_0_and_1_and_read_back_equal(tmp_path):
    values = np.arange(256, dtype=np.uint8)
    records = [values > 100, values.astype(bool), np.ones(5, bool), np.zeros(0, bool), ~(values % 3 == 0)]
    with varstore.Writer(tmp_path / "flags", codec="ndarray", dtype="bool") as writer:
        writer.extend(records)
    with varstore.Writer(tmp_path / "docs", codec="msgpack") as writer:
        writer.extend([{"mask": record, "flag": np.bool_(index % 2)} for index, record in enumerate(records)])
    assert set((tmp_path / "flags.data").read_bytes()) == {0, 1}
    with varstore.open(tmp_path / "flags") as flags, varstore.open(tmp_path / "docs") as docs:
        flags.verify()
        docs.verify()
        for index, record in enumerate(records):
            assert flags[index].dtype == np.bool_ and np.array_equal(flags[index], record)
            assert np.array_equal(docs[index]["mask"], record) and docs[index]["flag"].tobytes() == bytes([index % 2])


# -- readers: ndarray shards ------------------------------------------------------------------------

# Records [1, 0], [0, 1, 1, 1], [1, 2]: record 2 holds the byte 2 (rows of 2 elements in BOOL_ROWS).
DAMAGED_DATA, DAMAGED_OFFSETS = b"\x01\x00" + b"\x00\x01\x01\x01" + b"\x01\x02", [0, 2, 6, 8]

def _read(reader, way: str):
    if way == "item":
        return reader[2]
    if way == "batch":
        return reader.get_batch([0, 2])
    if way == "slice":
        return reader[0:3]
    if way == "iteration":
        return list(reader)
    if way == "flat batch":
        return reader.get_batch_flat([2, 0])
    if way == "iter_flat":
        return list(reader.iter_flat(2))
    if way == "as_array":
        return reader.as_array()
    raise AssertionError(way)


@pytest.mark.parametrize("params", [BOOLS, BOOL_ROWS], ids=["1-D", "rows of 2"])
@pytest.mark.parametrize("way", ["item", "batch", "slice", "iteration", "flat batch", "iter_flat", "as_array"])
def test_ndarray_bool_record_holding_the_byte_2_is_damaged_on_every_way_of_reading(tmp_path, params, way):
    path = forge_shard(tmp_path / "flags", "ndarray", DAMAGED_DATA, DAMAGED_OFFSETS, checksums=True, params=params)
    with varstore.open(path) as reader:
        assert reader[1].tobytes() == b"\x00\x01\x01\x01"
        with pytest.raises(varstore.CorruptRecordError, match=r"record 2 .*\|b1 element 1 is the byte 2") as caught:
            _read(reader, way)
        assert caught.value.records == [2]


@pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])
@pytest.mark.parametrize("params", [BOOLS, BOOL_ROWS], ids=["1-D", "rows of 2"])
def test_verify_lists_every_bool_record_holding_another_byte(tmp_path, params, checksums):
    data = b"\x01\x00" + b"\xff\x01" + b"\x00\x00" + b"\x01\x80"
    path = forge_shard(tmp_path / "flags", "ndarray", data, [0, 2, 4, 6, 8], checksums=checksums, params=params)
    with varstore.open(path) as reader:
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
    assert caught.value.records == [1, 3]


@pytest.mark.parametrize("params", [BOOLS, BOOL_ROWS], ids=["1-D", "rows of 2"])
def test_spec_reader_refuses_the_bool_record_holding_the_byte_2(tmp_path, params):
    path = forge_shard(tmp_path / "flags", "ndarray", DAMAGED_DATA, DAMAGED_OFFSETS, checksums=True, params=params)
    with pytest.raises(spec_reader.SpecError, match="0 or 1"):
        spec_reader.open_shard(path).record(2)


def test_records_with_invalid_bools_finds_each_damaged_record_in_one_pass():
    data = np.frombuffer(b"\x01\x00" + b"\x00\x03" + b"" + b"\x01" + b"\x09\x09\x00", np.uint8)
    offsets = np.array([0, 2, 4, 4, 5, 8])
    assert NdarrayCodec("bool").records_with_invalid_bools(data, offsets).tolist() == [1, 4]
    assert NdarrayCodec("bool").records_with_invalid_bools(data, offsets[1:4]).tolist() == [0]
    assert NdarrayCodec("uint8").records_with_invalid_bools(data, offsets).tolist() == []


# -- readers: msgpack array extensions --------------------------------------------------------------


@pytest.mark.parametrize("payload", [
    msgpack.packb({"mask": msgpack.ExtType(1, b"\x03|b1\x01" + struct.pack("<Q", 3) + b"\x01\x00\x02")}),
    array_extension(b"|b1", (), b"\xff"),  # what an np.bool_ scalar is stored as
    msgpack.packb([1, msgpack.ExtType(1, b"\x03|b1\x02" + struct.pack("<2Q", 1, 2) + b"\x00\x07")]),
], ids=["array", "0-d", "nested"])
def test_msgpack_bool_array_holding_another_byte_is_a_damaged_record(tmp_path, payload):
    msgpack_shard(tmp_path / "docs", [msgpack.packb({"fine": True}), payload])
    with pytest.raises(ValueError, match=r"\|b1 element \d is the byte (2|255|7); a \|b1 element is 0 or 1"):
        MsgpackCodec().decode(payload, 0, len(payload))
    with varstore.open(tmp_path / "docs") as reader:
        assert reader[0] == {"fine": True}
        for read in (lambda: reader[1], lambda: reader.get_batch([0, 1]), lambda: list(reader)):
            with pytest.raises(varstore.CorruptRecordError, match=r"record 1 .*\|b1 element") as caught:
                read()
            assert caught.value.records == [1]
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
        assert caught.value.records == [1]
    with pytest.raises(spec_reader.SpecError, match="0 or 1"):
        spec_reader.read_shard(str(tmp_path / "docs"))
