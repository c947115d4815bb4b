"""TFRecord files: convert's records are those the `tfrecord` package (a TFRecord writer and reader without
TensorFlow) wrote and reads back; the framing and its two CRCs, and the Example decoder, are checked against
models (the peer's masked CRC, protobuf's own parser of tf.train.Example) on generated input; damaged, cut and
hostile files are refused naming the file and the record."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tfrecord import TFRecordWriter, example_pb2
from tfrecord.reader import tfrecord_iterator, tfrecord_loader

import varstore
from varstore.conversion import convert
from varstore.conversion.tfrecord import decode_example, example_decoder, framed_records
from varstore.errors import CommandError, VarstoreError
from varstore.remote.filesystems import open_filesystem

from .helpers_cli import assert_one_line_error, run


def _features(index: int) -> dict[str, tuple[Any, str]]:
    """One Example as a tfrecord user writes it: an image's bytes, a label, a box of floats, several tags."""
    return {
        "image": (os.urandom(index * 37 % 500 + 1) + b"x", "byte"),  # no trailing NUL: the peer's arrays strip them
        "label": (index % 10 - 3, "int"),
        "box": ([0.25 * index, -1.5, 3e38, 1e-45][: index % 4 + 1], "float"),
        "tags": ([b"a", b"bc", f"t{index}".encode()][: index % 3], "byte"),
        "ids": (list(range(index, index + index % 5)) + [2**63 - 1, -(2**63)], "int"),
    }


def _write_tfrecord(path: Path, start: int, count: int) -> Path:
    writer = TFRecordWriter(str(path))
    for index in range(start, start + count):
        writer.write(_features(index))
    writer.close()
    return path


def _peer_examples(path: Path, compression_type: str | None = None) -> list[dict[str, Any]]:
    """The Examples of `path` as the tfrecord package reads them, its arrays of several bytes values as lists."""
    return [{name: [bytes(item) for item in value] if isinstance(value, np.ndarray) and value.dtype.kind == "S"
             else value for name, value in example.items()}
            for example in tfrecord_loader(str(path), None, compression_type=compression_type)]


def _same(found: Any, expected: Any) -> bool:
    """Equal values, arrays equal in dtype and in every byte."""
    if isinstance(expected, np.ndarray):
        return isinstance(found, np.ndarray) and found.dtype == expected.dtype and found.tobytes() == expected.tobytes()
    if isinstance(expected, dict):
        return isinstance(found, dict) and found.keys() == expected.keys() and all(
            _same(found[key], expected[key]) for key in expected)
    if isinstance(expected, list):
        return isinstance(found, list) and len(found) == len(expected) and all(map(_same, found, expected))
    return type(found) is type(expected) and found == expected


def _records(path: Path) -> list[Any]:
    with varstore.open(path) as dataset:
        return list(dataset)


def _assert_same_records(found: list[Any], expected: list[Any]) -> None:
    assert len(found) == len(expected)
    for index, (record, example) in enumerate(zip(found, expected, strict=True)):
        assert _same(record, example), (index, record, example)


@pytest.mark.parametrize("workers", [1, 2])
def test_every_example_equals_what_the_tfrecord_package_reads_from_its_own_files(tmp_path, workers):
    paths = [_write_tfrecord(tmp_path / f"train-{part}.tfrecord", part * 7, 7) for part in range(3)]
    assert convert(str(tmp_path / "train-{0..2}.tfrecord"), tmp_path / "ds", workers=workers) == 21
    _assert_same_records(_records(tmp_path / "ds"), [example for path in paths for example in _peer_examples(path)])


def test_raw_records_equal_the_peers_record_bytes(tmp_path):
    path = _write_tfrecord(tmp_path / "a.tfrecord", 0, 9)
    convert(str(path), tmp_path / "ds", codec="bytes")
    assert _records(tmp_path / "ds") == [bytes(record) for record in tfrecord_iterator(str(path))]


def test_gzipped_files_by_name_or_by_compression_type_equal_the_peers_reading(capsys, tmp_path):
    plain = _write_tfrecord(tmp_path / "a.tfrecord", 0, 8)
    with open(plain, "rb") as source, gzip.open(tmp_path / "a.tfrecord.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    expected = _peer_examples(tmp_path / "a.tfrecord.gz", compression_type="gzip")
    convert(str(tmp_path / "a.tfrecord.gz"), tmp_path / "by-name")
    _assert_same_records(_records(tmp_path / "by-name"), expected)
    shutil.copy(tmp_path / "a.tfrecord.gz", tmp_path / "b.tfrecord")
    code, _, err = run(capsys, "convert", tmp_path / "b.tfrecord", tmp_path / "by-type", "--compression-type", "gzip")
    assert code == 0, err
    _assert_same_records(_records(tmp_path / "by-type"), expected)


def test_a_glob_of_files_at_an_s3_url_reads_as_the_local_files(s3_server, tmp_path):
    paths = [_write_tfrecord(tmp_path / f"part-{part}.tfrecord", part * 5, 5) for part in range(2)]
    bucket = s3_server.new_bucket()
    fs, _ = open_filesystem(f"s3://{bucket}/x", s3_server.storage_options)
    for path in paths:
        fs.put_file(str(path), f"{bucket}/tf/{path.name}")
    convert(f"s3://{bucket}/tf/part-*.tfrecord", tmp_path / "ds", source_storage_options=s3_server.storage_options)
    _assert_same_records(_records(tmp_path / "ds"), [example for path in paths for example in _peer_examples(path)])


# The framing, against a file framed with the peer's masked CRC.


def _framed(records: list[bytes]) -> bytes:
    """`records` framed as TFRecord frames them, with the tfrecord package's masked CRC32C."""
    frames = []
    for data in records:
        length = struct.pack("<Q", len(data))
        frames.append(length + TFRecordWriter.masked_crc(length) + data + TFRecordWriter.masked_crc(data))
    return b"".join(frames)


def _read_framed(data: bytes, *, size_known: bool = True) -> list[bytes]:
    return list(framed_records(io.BytesIO(data), "f.tfrecord", size=len(data) if size_known else None,
                               max_record_bytes=1 << 20))


_RECORD_LISTS = st.lists(st.binary(max_size=300), min_size=1, max_size=6)


@given(_RECORD_LISTS)
def test_framed_records_are_read_back_whole_and_in_order(records):
    assert _read_framed(_framed(records)) == records


def _record_at(records: list[bytes], position: int) -> int:
    """The number of the record whose frame holds byte `position` of the framed file."""
    end = 0
    for number, data in enumerate(records):
        end += 16 + len(data)
        if position < end:
            return number
    raise AssertionError(position)


@given(_RECORD_LISTS, st.data())
def test_any_flipped_bit_is_refused_naming_the_record_it_lies_in(records, data):
    framed = bytearray(_framed(records))
    position = data.draw(st.integers(0, len(framed) - 1))
    framed[position] ^= 1 << data.draw(st.integers(0, 7))
    number = _record_at(records, position)
    with pytest.raises(CommandError, match=rf"^f\.tfrecord, record {number}: (damaged|cut short)"):
        _read_framed(bytes(framed))


@given(_RECORD_LISTS, st.data(), st.booleans())
def test_a_file_cut_inside_a_record_is_refused_naming_it(records, data, size_known):
    framed = _framed(records)
    boundaries = set(np.cumsum([0] + [16 + len(record) for record in records]).tolist())
    cut = data.draw(st.integers(1, len(framed) - 1).filter(lambda position: position not in boundaries))
    with pytest.raises(CommandError, match=rf"^f\.tfrecord, record {_record_at(records, cut)}: cut short"):
        _read_framed(framed[:cut], size_known=size_known)


def test_a_length_past_the_end_of_the_file_is_refused_before_its_data_is_read():
    framed = _framed([b"first", b"x" * 100])
    with pytest.raises(CommandError, match=r"^f\.tfrecord, record 1: cut short: its 100 bytes and CRC end at byte 137, "
                       r"past the end of the 120-byte file"):
        _read_framed(framed[:120])


def test_a_length_over_max_record_bytes_is_refused_before_its_data_is_read():
    framed = _framed([b"x" * 100])
    with pytest.raises(CommandError, match=r"record 0: 100 bytes, over --max-record-bytes \(99\)"):
        list(framed_records(io.BytesIO(framed), "f.tfrecord", size=None, max_record_bytes=99))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda framed, second: framed[: second + 5], "f.tfrecord, record 1: cut short: 5 of the 12 bytes"),
    (lambda framed, second: framed[: second + 8] + b"\0\0\0\0" + framed[second + 12 :],
     "f.tfrecord, record 1: damaged: the CRC32C of its length does not match"),
    (lambda framed, second: framed[:-1] + bytes([framed[-1] ^ 0x80]),
     "f.tfrecord, record 1: damaged: the CRC32C of its 3 bytes of data does not match"),
])
def test_damage_is_refused_naming_the_file_and_record(capsys, tmp_path, damage, message):
    framed = _framed([b"first", b"abc"])
    (tmp_path / "f.tfrecord").write_bytes(damage(framed, 16 + 5))
    code, _, err = run(capsys, "convert", tmp_path / "f.tfrecord", tmp_path / "ds", "--codec", "bytes")
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "ds").exists()


def test_a_gzipped_file_cut_short_is_refused_naming_the_record_reached(tmp_path):
    plain = _write_tfrecord(tmp_path / "a.tfrecord", 0, 30)
    packed = gzip.compress(plain.read_bytes())
    (tmp_path / "a.tfrecord.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(VarstoreError, match=r"a\.tfrecord\.gz, record \d+: (cannot decompress|cut short)"):
        convert(str(tmp_path / "a.tfrecord.gz"), tmp_path / "ds")


def test_a_gzipped_file_whose_crc_does_not_match_is_refused(tmp_path):
    packed = bytearray(gzip.compress(_write_tfrecord(tmp_path / "a.tfrecord", 0, 5).read_bytes()))
    packed[-8] ^= 0xFF  # the gzip trailer's CRC32: every record still decompresses and frames well
    (tmp_path / "a.tfrecord.gz").write_bytes(packed)
    refusal = r"a\.tfrecord\.gz, record 5: cannot decompress it \(gzip\): CRC check failed"  # past the last record
    with pytest.raises(VarstoreError, match=refusal):
        convert(str(tmp_path / "a.tfrecord.gz"), tmp_path / "ds")


# The Example decoder, against protobuf's own parser of tf.train.Example (tfrecord's example_pb2).


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


_UNKNOWN = st.one_of(
    st.builds(lambda n, v: _tag(n, 0) + _varint(v), st.integers(4, 30), st.integers(0, 2**64 - 1)),
    st.builds(lambda n, v: _tag(n, 1) + v, st.integers(4, 30), st.binary(min_size=8, max_size=8)),
    st.builds(lambda n, v: _tag(n, 5) + v, st.integers(4, 30), st.binary(min_size=4, max_size=4)),
    st.builds(_delimited, st.integers(4, 30), st.binary(max_size=8)),
)
_FLOATS = st.floats(width=32, allow_nan=False)
_INT64S = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _list_message(draw: Any, kind: int) -> bytes:
    """A BytesList (1), FloatList (2) or Int64List (3), numbers packed or one field each, unknown fields between."""
    parts = []
    if kind == 1:
        parts = [_delimited(1, value) for value in draw(st.lists(st.binary(max_size=12), max_size=4))]
    elif kind == 2:
        values = draw(st.lists(_FLOATS, max_size=5))
        if draw(st.booleans()):
            parts = [_delimited(1, struct.pack(f"<{len(values)}f", *values))]
        else:
            parts = [_tag(1, 5) + struct.pack("<f", value) for value in values]
    else:
        values = draw(st.lists(_INT64S, max_size=5))
        if draw(st.booleans()):
            parts = [_delimited(1, b"".join(_varint(value % 2**64) for value in values))]
        else:
            parts = [_tag(1, 0) + _varint(value % 2**64) for value in values]
    parts += draw(st.lists(_UNKNOWN, max_size=1))
    return b"".join(draw(st.permutations(parts)))


@st.composite
def _feature_message(draw: Any) -> bytes:
    """A Feature: none, one or several of its kinds set in turn (protobuf keeps the last, merging repeats)."""
    kinds = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=3))
    parts = [_delimited(kind, draw(_list_message(kind))) for kind in kinds]
    return b"".join(parts + draw(st.lists(_UNKNOWN, max_size=1)))


@st.composite
def _example_message(draw: Any) -> bytes:
    """An Example whose feature names repeat at times (the last entry wins), a value given twice (merged), Features
    given twice (merged), and unknown fields at every level."""
    names = st.sampled_from(["image", "label", "box", "é", ""])
    entries = []
    for _ in range(draw(st.integers(0, 5))):
        values = [_delimited(2, draw(_feature_message())) for _ in range(draw(st.integers(0, 2)))]
        entries.append(_delimited(1, _delimited(1, draw(names).encode()) + b"".join(values)
                                  + b"".join(draw(st.lists(_UNKNOWN, max_size=1)))))
    split = draw(st.integers(0, len(entries)))
    features = [b"".join(entries[:split]), b"".join(entries[split:])]
    return b"".join([_delimited(1, features[0]), *draw(st.lists(_UNKNOWN, max_size=1)), _delimited(1, features[1])])


def _protobufs_reading(data: bytes) -> dict[str, Any]:
    """The Example `data` as protobuf parses it, in the values the decoder promises."""
    example, values = example_pb2.Example.FromString(data), {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            found = list(feature.bytes_list.value)
            values[name] = found[0] if len(found) == 1 else found
        elif kind == "float_list":
            values[name] = np.array(feature.float_list.value, dtype=np.float32)
        elif kind == "int64_list":
            values[name] = np.array(feature.int64_list.value, dtype=np.int64)
        else:
            values[name] = None
    return values


@given(_example_message())
def test_the_decoder_reads_every_example_as_protobuf_parses_it(data):
    expected, decoded = _protobufs_reading(data), decode_example(data, "f, record 0")
    assert _same(decoded, expected)
    assert list(decoded) == sorted(expected)  # in one order, whatever order the map was written in


@given(_example_message(), st.data())
def test_a_cut_example_is_refused_or_read_as_protobuf_reads_it(data, draw):
    """A prefix of a message is either malformed (refused by both) or a shorter message (read alike)."""
    cut = data[: draw.draw(st.integers(0, max(0, len(data) - 1)))]
    try:
        expected = _protobufs_reading(cut)
    except Exception:  # protobuf's DecodeError: the decoder must refuse it too
        with pytest.raises(CommandError, match="^f, record 0"):
            decode_example(cut, "f, record 0")
    else:
        assert _same(decode_example(cut, "f, record 0"), expected)


@pytest.mark.parametrize(("message", "refusal"), [
    (_tag(1, 2) + b"\xff" * 10 + b"\x01", "a varint longer than 10 bytes"),
    (_tag(1, 2) + b"\xff" * 9 + b"\x02", "a varint of more than 64 bits, past protobuf's 64"),
    (_delimited(1, _delimited(1, _delimited(2, _delimited(3, _delimited(1, b"\x01" + b"\xff" * 10 + b"\x01"))))),
     "a varint longer than 10 bytes"),  # packed ints decoded one by one, and by numpy:
    (_delimited(1, _delimited(1, _delimited(2, _delimited(3, _delimited(1, b"\x01" * 30 + b"\xff" * 10 + b"\x01"))))),
     "a varint longer than 10 bytes"),
    (_delimited(1, _delimited(1, _delimited(2, _delimited(3, _delimited(1, b"\x01\x81"))))),
     "a varint runs past the end of its message"),
    (_tag(1, 2) + _varint(100) + b"abc", "a length of 100 bytes runs past the end of its message (3 bytes left)"),
    # An entry's length past the end of its Features message, though the record holds more bytes after it.
    (_delimited(1, _tag(1, 2) + _varint(50) + b"xyz") + _delimited(9, b"y" * 100), "a length of 50 bytes runs past"),
    # A float (fixed32) with one of its 4 bytes.
    (_delimited(1, _delimited(1, _delimited(2, _delimited(2, b"\x0d\x00")))), "a length of 4 bytes runs past"),
    (_delimited(1, _delimited(1, _delimited(2, _delimited(2, _delimited(1, b"\0\0\0"))))),
     "packed floats of 3 bytes, not a multiple of 4"),
    (_tag(1, 3), "field 1 has wire type 3, a group"),
    (_tag(2, 7), "field 2 has wire type 7, not a protobuf wire type"),
    (b"\x02\x00", "a field numbered 0"),
    (_delimited(1, _delimited(1, _delimited(1, b"\xff\xfe"))), "a feature name that is not UTF-8"),
])
def test_a_malformed_example_is_refused_as_protobuf_refuses_it(message, refusal):
    with pytest.raises(Exception, match="(?i)error|truncated|invalid|parse"):
        example_pb2.Example.FromString(message)
    with pytest.raises(CommandError, match=rf"^f\.tfrecord, record 4(, feature '')?: {re.escape(refusal)}"):
        decode_example(message, "f.tfrecord, record 4")


@pytest.mark.parametrize("last", [0x01, 0x02, 0x7F])
def test_a_ten_byte_int64_keeps_its_low_64_bits_as_protobuf_reads_it(last):
    varint = b"\x85" + b"\xff" * 8 + bytes([last])
    # packed (3 decoded one by one, 4 by numpy), and one field each
    for values in (_delimited(1, varint * 3), _delimited(1, varint * 4), (_tag(1, 0) + varint) * 3):
        message = _delimited(1, _delimited(1, _delimited(1, b"ids") + _delimited(2, _delimited(3, values))))
        assert _same(decode_example(message, "f"), _protobufs_reading(message))


def test_a_malformed_example_fails_convert_naming_the_file_and_record(capsys, tmp_path):
    (tmp_path / "f.tfrecord").write_bytes(_framed([_delimited(1, b""), _tag(1, 2) + b"\xff" * 11]))
    code, _, err = run(capsys, "convert", tmp_path / "f.tfrecord", tmp_path / "ds")
    assert_one_line_error(code, err, "f.tfrecord, record 1: a varint longer than 10 bytes")
    assert run(capsys, "convert", tmp_path / "f.tfrecord", tmp_path / "raw", "--codec", "bytes")[0] == 0


def test_codec_str_is_refused_for_tfrecord(capsys, tmp_path):
    _write_tfrecord(tmp_path / "a.tfrecord", 0, 1)
    code, _, err = run(capsys, "convert", tmp_path / "a.tfrecord", tmp_path / "ds", "--codec", "str")
    assert_one_line_error(code, err, "--codec str does not apply to TFRecord files")


# The fast path through protobuf's parser (tfrecord_protobuf), against the pure decoder: the same values, or the
# same refusal, on every message.
decode_example_with_protobuf = example_decoder()


def _outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    """What `decode` makes of `data`: its values, or the message of its refusal."""
    try:
        return "values", decode(data, "f, record 0")
    except CommandError as error:
        return "refused", str(error)


def _assert_fast_path_agrees(data: bytes) -> None:
    (kind, pure), (fast_kind, fast) = _outcome(decode_example, data), _outcome(decode_example_with_protobuf, data)
    assert fast_kind == kind, (data, pure, fast)
    assert _same(fast, pure), (data, pure, fast)
    if kind == "values":
        assert list(fast) == list(pure)  # in the same order: sorted by name


@given(_example_message())
def test_the_fast_path_reads_every_example_as_the_pure_decoder(data):
    _assert_fast_path_agrees(data)


@given(st.binary(max_size=64))
def test_the_fast_path_reads_or_refuses_any_bytes_as_the_pure_decoder(data):
    _assert_fast_path_agrees(data)


@given(_example_message(), st.data())
def test_the_fast_path_reads_or_refuses_a_cut_example_as_the_pure_decoder(data, draw):
    _assert_fast_path_agrees(data[: draw.draw(st.integers(0, max(0, len(data) - 1)))])


_ENTRY_WITH_UNKNOWN = _delimited(1, _delimited(1, _delimited(1, b"a") + _delimited(2, b"") + _tag(3, 0) + b"\x01"))
_TEN_BYTE_INT = _delimited(1, _delimited(1, _delimited(1, b"ids") + _delimited(2, _delimited(3, _delimited(
    1, b"\x85" + b"\xff" * 8 + b"\x7f")))))
_NAN_BITS = struct.pack("<3I", 0x7FA00001, 0xFFC12345, 0x7F800001)  # signalling, negative quiet, least signalling


@pytest.mark.parametrize("data", [
    _ENTRY_WITH_UNKNOWN,  # protobuf keeps the entry as an unknown field of Features: out of the map in both
    _ENTRY_WITH_UNKNOWN + _delimited(1, _delimited(1, _delimited(1, b"b"))),
    _TEN_BYTE_INT,  # the low 64 bits of a 10-byte varint
    _delimited(1, _delimited(1, _delimited(1, b"tokens") + _delimited(2, _delimited(3, _delimited(
        1, b"".join(_varint(token * 7919 % 2**64) for token in range(-200, 300))))))),  # a long packed list
    _delimited(1, b"") + _tag(7, 3) + _tag(7, 4),  # an unknown group, which protobuf skips: refused by both
    _delimited(1, _delimited(1, _delimited(1, b"x") + _delimited(2, _delimited(2, _delimited(1, _NAN_BITS))))),
    # refused by both, with the pure decoder's message: a varint of 11 bytes, a length past 64 bits, field 0, a
    # name not UTF-8, wire type 7, packed floats of 3 bytes
    _tag(1, 2) + b"\xff" * 10 + b"\x01", _tag(1, 2) + b"\xff" * 9 + b"\x02", b"\x02\x00",
    _delimited(1, _delimited(1, _delimited(1, b"\xff\xfe"))), _tag(2, 7),
    _delimited(1, _delimited(1, _delimited(2, _delimited(2, _delimited(1, b"\0\0\0"))))),
])
def test_the_fast_path_reads_the_known_divergences_of_protobuf_as_the_pure_decoder(data):
    _assert_fast_path_agrees(data)


def test_nan_floats_keep_their_bits_on_the_fast_path():
    message = _delimited(1, _delimited(1, _delimited(1, b"x") + _delimited(2, _delimited(2, _delimited(1, _NAN_BITS)))))
    assert decode_example_with_protobuf(message, "f")["x"].tobytes() == _NAN_BITS


def test_convert_uses_the_fast_path_with_protobuf_and_the_pure_decoder_without(monkeypatch, tmp_path):
    path = _write_tfrecord(tmp_path / "a.tfrecord", 0, 20)
    assert example_decoder() is not decode_example  # protobuf is installed here
    convert(str(path), str(tmp_path / "fast"))
    monkeypatch.setitem(sys.modules, "google.protobuf", None)  # protobuf not installed
    monkeypatch.setitem(sys.modules, "varstore.conversion.tfrecord_protobuf", None)
    assert example_decoder() is decode_example
    convert(str(path), str(tmp_path / "pure"))
    expected = _peer_examples(path)
    _assert_same_records(_records(tmp_path / "fast"), expected)
    _assert_same_records(_records(tmp_path / "pure"), expected)


@pytest.mark.timeout(180)
def test_import_varstore_and_its_converters_imports_no_protobuf():
    code = "import sys, varstore, varstore.conversion.sources; print([m for m in sys.modules if 'protobuf' in m])"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"
