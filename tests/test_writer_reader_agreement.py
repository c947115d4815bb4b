"""Findings of attack 10 on writers and readers: a writer commits nothing a reader refuses (an ndarray shape outside
§2.1, an empty manifest from a directory whose path holds the temporary mark), flat reads hand out no record a
read refuses (§1.3), and subclasses of int, float, str and bytes are stored as their base type (§2.2)."""

from __future__ import annotations

import enum
import re

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format.codecs import MAX_ARRAY_DIMS, codec_from_stored, make_codec
from varstore.local.publish import TEMP_MARK

from .test_reader_damage import forge_shard, joined

# -- ndarray shapes: one rule for a writer's arguments and a stored shard ----------------------------------

IMPOSSIBLE_SHAPES = {
    "dimension-2**32": [1 << 32],
    "dimension-2**40": [3, 1 << 40],
    "dimension-0": [4, 0],
    "dimension-negative": [-1],
    "32-dimensions": [1] * MAX_ARRAY_DIMS,
    "float-dimension": [2.0],
    "bool-dimension": [True],
}


@pytest.mark.parametrize("shape", IMPOSSIBLE_SHAPES.values(), ids=IMPOSSIBLE_SHAPES)
def test_writer_refuses_a_trailing_shape_no_reader_opens(tmp_path, shape):
    with pytest.raises(varstore.RecordTypeError, match="trailing shape"):
        varstore.Writer(tmp_path / "s", codec="ndarray", dtype="u1", shape=shape)
    with pytest.raises(varstore.FormatError, match="trailing shape"):
        codec_from_stored("ndarray", {"dtype": "|u1", "shape": shape}, path="manifest.json")
    assert not list(tmp_path.iterdir()), "nothing is committed"


def test_sharded_writer_refuses_a_dimension_of_2_32_before_creating_the_dataset(tmp_path):
    with pytest.raises(varstore.RecordTypeError, match="trailing shape"):
        varstore.ShardedWriter(tmp_path / "ds", codec="ndarray", dtype="u1", shape=[1 << 32])
    assert not (tmp_path / "ds").exists()


def test_largest_allowed_shape_is_written_and_read_back(tmp_path):
    shape = [1] * (MAX_ARRAY_DIMS - 2) + [(1 << 32) - 1]
    assert make_codec("ndarray", dtype="u1", shape=shape).shape == tuple(shape)
    with varstore.Writer(tmp_path / "s", codec="ndarray", dtype="u1", shape=[1] * (MAX_ARRAY_DIMS - 1)) as writer:
        writer.append(np.ones((2,) + (1,) * (MAX_ARRAY_DIMS - 1), np.uint8))
    with varstore.open(tmp_path / "s") as reader:
        assert reader.shape == (1,) * (MAX_ARRAY_DIMS - 1) and reader[0].shape == (2,) + reader.shape


# -- write_manifest lists the shards of a directory whatever the directory's own path ----------------------


def test_write_manifest_lists_shards_of_a_directory_whose_path_holds_the_temporary_mark(tmp_path):
    directory = tmp_path / f"exports{TEMP_MARK}x"
    directory.mkdir()
    with varstore.Writer(directory / "a", codec="bytes") as writer:
        writer.append(b"hello")
    assert varstore.write_manifest(directory) == ["a"]
    with varstore.open(directory) as dataset:
        assert list(dataset) == [b"hello"]


def test_write_manifest_still_skips_temporary_index_files(tmp_path):
    with varstore.Writer(tmp_path / "a", codec="bytes") as writer:
        writer.append(b"hello")
    (tmp_path / f"b{TEMP_MARK}123.index").write_bytes(b"half written")
    assert varstore.write_manifest(tmp_path) == ["a"]


# -- flat reads refuse every record a read refuses -----------------------------------------------------------

# (codec, payloads, the records a read refuses)
UNDECODABLE = {
    "str-ff-fe": ("str", [b"ok", b"\xff\xfe", "\u00e9".encode()], [1]),
    "str-split-character": ("str", [b"ok", b"\xc3", b"\xa9", b""], [1, 2]),
    "str-truncated-last": ("str", ["\u00e9".encode(), b"\xe2\x82"], [1]),
    "msgpack-c1": ("msgpack", [msgpack.packb({"a": 1}), b"\xc1", msgpack.packb([1])], [1]),
    "msgpack-trailing-byte": ("msgpack", [msgpack.packb([1]) + b"\x00", msgpack.packb("x")], [0]),
}


def flat_reads(reader, index: int) -> dict:
    return {
        "get_batch_flat": lambda: reader.get_batch_flat([index]),
        "get_batch_flat-with-others": lambda: reader.get_batch_flat([index, 0, len(reader) - 1]),
        "iter_flat-1": lambda: list(reader.iter_flat(1)),
        "iter_flat-all": lambda: list(reader.iter_flat()),
    }


@pytest.mark.parametrize("checksums", [True, False], ids=["record-checksums", "no-record-checksums"])
@pytest.mark.parametrize("case", UNDECODABLE)
def test_flat_reads_refuse_str_and_msgpack_records_a_read_refuses(tmp_path, case, checksums):
    codec, payloads, damaged = UNDECODABLE[case]
    path = forge_shard(tmp_path / "shard", codec, *joined(payloads), checksums=checksums)
    with varstore.open(path) as reader:
        for index in range(len(reader)):
            if index not in damaged:
                reader[index]
                assert reader.get_batch_flat([index]).values.tobytes() == payloads[index]
                continue
            with pytest.raises(varstore.CorruptRecordError, match=rf"record {index}\b"):
                reader[index]
            for name, read in flat_reads(reader, index).items():
                named = min(damaged) if name.startswith("iter_flat") else index
                with pytest.raises(varstore.CorruptRecordError, match=rf"record {named}\b"):
                    read()


def test_flat_reads_of_valid_str_and_msgpack_records_return_their_bytes(tmp_path):
    texts = ["", "a", "\u00e9t\u00e9", "\U0001f600", "", "x" * 300, "\u2028"]
    records = [{"k": [1, 2.5, None]}, [], "s", np.arange(3, dtype="<i4")]
    for codec, items in (("str", texts), ("msgpack", records)):
        with varstore.Writer(tmp_path / codec, codec=codec) as writer:
            writer.extend(items)
        with varstore.open(tmp_path / codec) as reader:
            offsets = reader.offsets.tolist()
            stored = np.fromfile(tmp_path / f"{codec}.data", np.uint8).tobytes()
            payloads = [stored[a:b] for a, b in zip(offsets, offsets[1:])]
            flat = reader.get_batch_flat(list(range(len(items)))[::-1])
            got = [flat.values[a:b].tobytes() for a, b in zip(flat.offsets[:-1], flat.offsets[1:])]
            assert got == payloads[::-1]
            for batch_size in (1, 3, 100):
                got = [batch.values[a:b].tobytes() for batch in reader.iter_flat(batch_size)
                       for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]
                assert got == payloads


# -- §2.2: subclasses of int, float, str and bytes are stored as the base type --------------------------------


class Colour(enum.IntEnum):
    RED = 1


class Permission(enum.IntFlag):
    READ = 4


class Tag(str):
    pass


class Split(str, enum.Enum):
    TRAIN = "train"


class Metres(float):
    pass


class Blob(bytes):
    pass


def test_subclasses_of_int_float_str_bytes_read_back_as_the_base_type(tmp_path):
    record = {"colour": Colour.RED, "flag": Permission.READ, "tag": Tag("x"), "length": Metres(2.5),
              "blob": Blob(b"z"), Tag("key"): [Colour.RED, Metres(-0.0)], Split.TRAIN: Split.TRAIN,
              Colour.RED: Tag("by enum key")}
    with varstore.Writer(tmp_path / "s", codec="msgpack") as writer:
        writer.append(record)
    plain = {"colour": 1, "flag": 4, "tag": "x", "length": 2.5, "blob": b"z", "key": [1, -0.0], "train": "train",
             1: "by enum key"}
    with open(tmp_path / "s.data", "rb") as file:
        assert file.read() == msgpack.packb(plain, use_bin_type=True), "stored exactly as the base types"
    with varstore.open(tmp_path / "s") as reader:
        read = reader[0]
    assert read == plain
    assert [type(key) for key in read] == [str, str, str, str, str, str, str, int]
    assert [type(value) for value in read.values()] == [int, int, str, float, bytes, list, str, str]
    assert type(read["key"][0]) is int and type(read["key"][1]) is float


def test_bool_is_not_normalised_to_int(tmp_path):
    with varstore.Writer(tmp_path / "s", codec="msgpack") as writer:
        writer.append([True, 1])
    with varstore.open(tmp_path / "s") as reader:
        assert [type(value) for value in reader[0]] == [bool, int]


def test_a_str_subclass_key_equal_as_text_to_another_key_is_refused(tmp_path):
    class Distinct(str):
        __hash__ = object.__hash__

        def __eq__(self, other):
            return self is other

    with varstore.Writer(tmp_path / "s", codec="msgpack") as writer:
        with pytest.raises(varstore.RecordTypeError, match="repeats an earlier key"):
            writer.append({Distinct("k"): 1, "k": 2})


def test_write_manifest_refuses_a_shard_whose_data_file_fails_the_open_checks(tmp_path):
    """A data file that fails data_edge_crc32c (a reader refuses it at open) is not listed in a new manifest."""
    with varstore.Writer(str(tmp_path / "a")) as writer:
        writer.append(b"payload")
    with open(tmp_path / "a.data", "r+b") as file:
        file.write(b"P")
    with pytest.raises(varstore.FormatError, match="a.data"):
        varstore.write_manifest(tmp_path)
    assert not (tmp_path / "manifest.json").exists()
