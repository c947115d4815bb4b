"""The §6.1 notation: every storable record has one spelling that reads back exactly, every spelling one meaning.

`to_json` and `from_json` are checked against records a real msgpack codec stored and read back, against
spellings written here by hand with the meaning the spec gives them, and against `varstore dump --json`,
which must print the same notation.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

import varstore
from varstore.format.codecs import MsgpackCodec
from varstore.format.notation import from_json, to_json

from .helpers_cli import run, run_json_lines, strict_json, write_shard
from .test_codec_properties import msgpack_keys, msgpack_leaves, same

TAG_NAMES = ["$bytes", "$float", "$array", "$map", "$", "$foo"]


def spelled(record) -> str:
    """The JSON text of a record's spelling, as strict as JSON gets (a bare NaN would raise here)."""
    return json.dumps(to_json(record), allow_nan=False)


def read_back(text: str):
    return from_json(strict_json(text))


def with_quiet_nans(value):
    """`value` with every NaN made the quiet NaN of its width: the one NaN the notation spells (§6.1)."""
    if isinstance(value, float):
        return math.nan if math.isnan(value) else value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fc":
            return value
        parts = np.array(value).view(f"<f{value.dtype.itemsize // (2 if value.dtype.kind == 'c' else 1)}")
        parts[np.isnan(parts)] = np.nan
        return parts.view(value.dtype)
    if isinstance(value, dict):
        return {key: with_quiet_nans(item) for key, item in value.items()}
    if isinstance(value, list):
        return [with_quiet_nans(item) for item in value]
    return value


def float_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# NaNs of every kind (negative, with a payload, signalling), which the notation all spells as the quiet NaN.
ODD_FLOATS = [float_from_bits(bits) for bits in (0xFFF8000000000000, 0x7FF8000000000001, 0x7FF4000000000000)]
odd_floats = st.sampled_from([*ODD_FLOATS, math.nan, -0.0, math.inf, -math.inf])
odd_float_arrays = st.tuples(st.lists(odd_floats, max_size=3), st.sampled_from(["<f2", "<f4", "<f8", "<c8", "<c16"])).map(
    lambda case: np.array(*case)
)
# Maps that would pass for a spelling if the notation wrote them as plain objects.
LOOKALIKE_BODIES = ["00", "NaN", "-Infinity", [], [[1, "a"]], {"dtype": "|u1", "shape": [1], "values": [7]}]
lookalikes = st.builds(lambda tag, body: {tag: body}, st.sampled_from(TAG_NAMES), st.sampled_from(LOOKALIKE_BODIES))
# Keys that look like the notation's tags, so maps that could pass for a spelling are drawn often.
records_with_tag_like_keys = st.recursive(
    msgpack_leaves | odd_floats | odd_float_arrays | lookalikes,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(msgpack_keys | st.sampled_from(TAG_NAMES), children, max_size=3)
    ),
    max_leaves=10,
)


def stored(record):
    """`record` as the msgpack codec reads it back after writing it (the draw is rejected if the writer refuses it)."""
    codec = MsgpackCodec()
    try:
        payload = codec.encode(record)
    except varstore.RecordTypeError:
        reject()
    return codec.decode(payload, 0, len(payload))


@given(records_with_tag_like_keys)
def test_every_storable_record_reads_back_exactly_from_its_spelling(record):
    record = stored(record)
    text = spelled(record)
    back = read_back(text)
    assert same(back, with_quiet_nans(record))
    assert spelled(back) == text  # and the spelling of what it reads is itself: one spelling per record


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-300, 300) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "00", "AB", "NaN", "Infinity", "<f4", "|b1", "<u2", "$map"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "dtype", "shape", "values", *TAG_NAMES]), children, max_size=3)
    ),
    max_leaves=8,
)


@given(json_values)
def test_a_spelling_is_refused_or_is_the_one_its_record_spells(value):
    try:
        record = from_json(value)
    except ValueError:
        return
    assert json.dumps(to_json(record)) == json.dumps(value)  # json.dumps tells 1, 1.0 and true apart


SPELLINGS = [
    ({"$map": [["$bytes", "00"]]}, {"$bytes": "00"}),
    ({"$map": [["a", 1], ["$array", [1]]]}, {"a": 1, "$array": [1]}),
    ({"$map": [[1, "int key"], ["1", "str key"], [-2, None]]}, {1: "int key", "1": "str key", -2: None}),
    ({"$map": [[2**64 - 1, -(2**63)]]}, {2**64 - 1: -(2**63)}),
    ({"b": 1, "a": 1.0, "c": [True, None, -0.0, 1e100]}, {"b": 1, "a": 1.0, "c": [True, None, -0.0, 1e100]}),
    ({"$bytes": ""}, b""),
    ({"$bytes": "00ff10"}, b"\x00\xff\x10"),
    ({"$float": "-Infinity"}, -math.inf),
    ({"$array": {"dtype": "|b1", "shape": [2], "values": [True, False]}}, np.array([True, False])),
    ({"$array": {"dtype": "<f4", "shape": [], "values": [0.10000000149011612]}}, np.array(0.1, np.float32)),
    ({"$array": {"dtype": "<u8", "shape": [0, 3], "values": []}}, np.zeros((0, 3), np.uint64)),
    ({"$array": {"dtype": "<c8", "shape": [1, 1], "values": [[{"$float": "Infinity"}, -0.0]]}},
     np.array([[complex(math.inf, -0.0)]], np.complex64)),
    ([{"$map": [[0, {"$map": [["$float", "NaN"]]}]]}], [{0: {"$float": "NaN"}}]),
]


@pytest.mark.parametrize("spelling, meaning", SPELLINGS)
def test_hand_written_spelling_means_what_the_spec_says(spelling, meaning):
    assert same(from_json(spelling), meaning)
    assert json.dumps(to_json(meaning)) == json.dumps(spelling)


def test_one_and_one_point_zero_are_an_integer_and_a_float():
    assert json.dumps(to_json([1, 1.0, np.float64(2.0), 1e16, 1e-05])) == "[1, 1.0, 2.0, 1e+16, 1e-05]"
    integer, real = from_json(json.loads("[1, 1.0]"))
    assert type(integer) is int and type(real) is float


def test_every_nan_is_spelled_nan_and_reads_back_as_the_quiet_nan_of_its_width():
    negative_nan = float_from_bits(0xFFF8000000000000)  # what inf - inf gives on x86
    arrays = [np.array([0x7FC00001, 0xFFC00000], np.uint32).view(np.float32), np.array([0xFE00], np.uint16).view(np.float16)]
    assert to_json([negative_nan, *arrays]) == [
        {"$float": "NaN"},
        {"$array": {"dtype": "<f4", "shape": [2], "values": [{"$float": "NaN"}, {"$float": "NaN"}]}},
        {"$array": {"dtype": "<f2", "shape": [1], "values": [{"$float": "NaN"}]}},
    ]
    nan, float32s, float16s = from_json(to_json([negative_nan, *arrays]))
    assert struct.pack("<d", nan).hex() == "000000000000f87f"
    assert float32s.view(np.uint32).tolist() == [0x7FC00000, 0x7FC00000] and float16s.view(np.uint16).tolist() == [0x7E00]


REFUSED = [
    ({"a": 1, "$b": 2}, "exactly one member"),
    ({"$bytes": "00", "x": 1}, "exactly one member"),
    ({"$foo": 1}, "unknown tag '\\$foo'"),
    ({"$": 1}, "unknown tag '\\$'"),
    ({"$bytes": "zz"}, "'zz'"),
    ({"$bytes": "AB"}, "lowercase hex.*'AB'"),
    ({"$bytes": "0"}, "'0'"),
    ({"$bytes": 0}, "lowercase hex"),
    ({"$float": "nan"}, "'nan'"),
    ({"$float": 1.0}, '"\\$float" takes'),
    ({"$array": {"dtype": "<u2", "shape": [1]}}, 'exactly "dtype", "shape" and "values"'),
    ({"$array": {"dtype": "<u2", "shape": [1], "values": [1], "order": "C"}}, 'exactly "dtype"'),
    ({"$array": {"dtype": "<u2", "shape": [2, 2], "values": [1, 2, 3]}}, "shape \\[2, 2\\] takes a list of 4 values"),
    ({"$array": {"dtype": "uint16", "shape": [1], "values": [1]}}, "dtype must be one of.*'uint16'"),
    ({"$array": {"dtype": ">u2", "shape": [1], "values": [1]}}, "'>u2'"),
    ({"$array": {"dtype": "<u16", "shape": [1], "values": [1]}}, "'<u16'"),
    ({"$array": {"dtype": "<u2", "shape": [-1], "values": []}}, "non-negative integers"),
    ({"$array": {"dtype": "<u2", "shape": [True], "values": [1]}}, "non-negative integers"),
    ({"$array": {"dtype": "<u2", "shape": 1, "values": [1]}}, "non-negative integers"),
    ({"$array": {"dtype": "<i4", "shape": [1], "values": [True]}}, "<i4 value is an integer.*True"),
    ({"$array": {"dtype": "|u1", "shape": [1], "values": [1.0]}}, "\\|u1 value is an integer.*1.0"),
    ({"$array": {"dtype": "|u1", "shape": [1], "values": [256]}}, "\\[0, 255\\].*256"),
    ({"$array": {"dtype": "<i8", "shape": [1], "values": [{"$float": "NaN"}]}}, "<i8 value"),
    ({"$array": {"dtype": "|b1", "shape": [1], "values": [1]}}, "true or false, not 1"),
    ({"$array": {"dtype": "<f8", "shape": [1], "values": [1]}}, "JSON float.*not 1"),
    ({"$array": {"dtype": "<f4", "shape": [1], "values": [0.1]}}, "0.1 is not a <f4 value"),
    ({"$array": {"dtype": "<f2", "shape": [1], "values": [70000.0]}}, "70000.0 is not a <f2 value"),
    ({"$array": {"dtype": "<c8", "shape": [1], "values": [1.0]}}, "\\[real, imaginary\\] pair"),
    ({"$array": {"dtype": "<c16", "shape": [1], "values": [[1.0, {"$float": "inf"}]]}}, "'inf'"),
    ({"$map": {"a": 1}}, "list of \\[key, value\\] entries"),
    ({"$map": [["a"]]}, "entry is a \\[key, value\\] list.*\\['a'\\]"),
    ({"$map": [[1.5, "x"]]}, "key is a string or an integer, not 1.5"),
    ({"$map": [[True, "x"]]}, "not True"),
    ({"$map": [[None, "x"]]}, "not None"),
    ({"$map": [[1, "a"], [1, "b"]]}, "key 1 twice"),
    ({"$map": [["a", 1]]}, "spelled as a plain object"),
    ({"$map": []}, "spelled as a plain object"),
    ([{"x": [{"$map": [["$k", {"$bytes": "0g"}]]}]}], "'0g'"),
    ([2**64, 0], "integer 18446744073709551616 is outside"),
    ({"$map": [[-(2**63) - 1, "x"]]}, "integer -9223372036854775809 is outside"),
    (math.nan, "not a JSON number"),
    ([math.inf], "not a JSON number"),
]


@pytest.mark.parametrize("spelling, message", REFUSED)
def test_invalid_spelling_is_refused_naming_it(spelling, message):
    with pytest.raises(ValueError, match=message):
        from_json(spelling)


def test_dump_json_prints_dollar_and_integer_keyed_maps_in_the_notation(capsys, tmp_path):
    records = [
        {"$bytes": b"\x00", "plain": 1.0},
        {1: "one", -2: [2.5, None], "1": {"$map": "not a tag here"}},
        {"outer": {"$float": "NaN", "inner": {"a": b"\xff"}}},
    ]
    shard = write_shard(tmp_path / "maps", records, codec="msgpack")
    expected = [
        {"$map": [["$bytes", {"$bytes": "00"}], ["plain", 1.0]]},
        {"$map": [[1, "one"], [-2, [2.5, None]], ["1", {"$map": [["$map", "not a tag here"]]}]]},
        {"outer": {"$map": [["$float", "NaN"], ["inner", {"a": {"$bytes": "ff"}}]]}},
    ]
    lines = run_json_lines(capsys, "dump", shard)
    assert [line["record"] for line in lines] == expected
    assert [to_json(record) for record in records] == expected  # dump spells as varstore.format.notation does
    assert [from_json(line["record"]) for line in lines] == records
    code, out, _ = run(capsys, "dump", shard, "--json", "-i", "0")
    assert code == 0 and '["plain", 1.0]' in out  # a float stays a float in the printed text
