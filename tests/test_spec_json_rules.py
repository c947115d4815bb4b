"""§1.4's JSON number and member-name rules, §3.1's case-insensitive names and §6.1's member order, judged by the
spec-only reader and by varstore alike (the ambiguities an attack on spec 1.1 found; a reader in another language
must decide them the same way)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.format.metadata import canonical_json, parse_strict_json
from varstore.format.notation import from_json, to_json

from . import spec_reader, spec_writer

DAMAGED = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "damaged"
DBL_MAX = struct.unpack("<d", struct.pack("<Q", 0x7FEFFFFFFFFFFFFF))[0]
SMALLEST_SUBNORMAL = struct.unpack("<d", struct.pack("<Q", 1))[0]


def both_parse(text: bytes) -> tuple:
    """The value each reader makes of the metadata-like JSON `text` (both must agree)."""
    return spec_reader.parse_strict_json(text, "§1.4"), parse_strict_json(text, 64, what="metadata", path="m")


@pytest.mark.parametrize(
    "number, value",
    [
        (b"1e-400", 0.0),  # underflows to 0: read as rounded, not refused
        (b"-1e-400", -0.0),
        (b"4e-320", 4e-320),  # a subnormal
        (b"2.4703282292062328e-324", SMALLEST_SUBNORMAL),  # just above half the smallest subnormal: rounds up to it
        (b"1.7976931348623158e308", DBL_MAX),  # above DBL_MAX in decimal, rounds down to it
        (b"1.797693134862315807e308", DBL_MAX),  # just below the halfway point to 2^1024
    ],
)
def test_a_number_is_read_as_its_nearest_float64_unless_that_is_infinite(number, value):
    for parsed in both_parse(b'{"x":' + number + b"}"):
        assert math.copysign(1, parsed["x"]) == math.copysign(1, value) and parsed["x"] == value


@pytest.mark.parametrize("number", [b"1.7976931348623159e308", b"1.797693134862315808e308", b"1e309", b"-2e308"])
def test_a_number_whose_nearest_float64_is_infinite_is_refused(number):
    """1.797693134862315808e308 is past the halfway point between DBL_MAX and 2^1024, so it rounds to infinity."""
    with pytest.raises(spec_reader.SpecError):
        spec_reader.parse_strict_json(b'{"x":' + number + b"}", "§1.4")
    with pytest.raises(varstore.FormatError, match="overflows"):
        parse_strict_json(b'{"x":' + number + b"}", 64, what="metadata", path="m")


def test_member_names_are_compared_after_unescaping():
    """"a" and "\\u0061" are one name, so the object repeats it."""
    with pytest.raises(spec_reader.SpecError, match="repeats a member name"):
        spec_reader.parse_strict_json(b'{"a":1,"\\u0061":2}', "§1.4")
    with pytest.raises(varstore.FormatError, match="appears twice"):
        parse_strict_json(b'{"a":1,"\\u0061":2}', 64, what="metadata", path="m")


def test_a_nul_in_a_member_name_is_allowed_and_makes_another_name():
    assert all(parsed == {"a": 1, "a\x00": 2} for parsed in both_parse(b'{"a":1,"a\\u0000":2}'))


def test_a_float_is_written_with_the_digits_closest_to_its_value_among_the_shortest():
    """Both 3.0168212434893705e+21 and ...704e+21 read back to this float; the canonical one is the closer to it."""
    value = float("3.0168212434893705e+21")
    assert float("3.0168212434893704e+21") == value
    assert canonical_json({"x": value}, what="m") == b'{"x":3.0168212434893705e+21}'


def test_notation_keeps_object_members_in_the_order_written():
    """§6.1: {"b": 1, "1": 2} is the map b -> 1, "1" -> 2 in that order (JavaScript's JSON.parse would put "1" first)."""
    spelled = json.loads('{"b": 1, "1": 2}')
    assert list(from_json(spelled)) == ["b", "1"]
    assert json.dumps(to_json(from_json(spelled))) == '{"b": 1, "1": 2}'


def test_spec_reader_refuses_shard_names_equal_ignoring_case_for_that_reason():
    """The damaged case lists "a" and "A"; without the rule the spec reader refused it only for missing A.* files."""
    raw = (DAMAGED / "shard-names-differ-only-in-case" / "manifest.json").read_bytes()
    with pytest.raises(spec_reader.SpecError, match="differ only in case"):
        spec_reader.parse_manifest(raw)


def test_minus_zero_is_read_as_the_integer_zero_and_written_as_0():
    """§1.4: -0 has no fraction or exponent, so it is the integer 0 (a manifest's "crc32c" counts it as 0), not -0.0."""
    for parsed in both_parse(b'{"x":-0}'):
        assert type(parsed["x"]) is int and parsed["x"] == 0
        assert canonical_json(parsed, what="m") == spec_writer.canonical_json(parsed) == b'{"x":0}'


@pytest.mark.parametrize(
    "value, spelled",
    [(2**50 + 0.25, "1125899906842624.2"), (2**50 + 0.75, "1125899906842624.8"), (2**50 + 1.25, "1125899906842625.2")],
)
def test_a_tie_between_two_shortest_float_spellings_goes_to_the_even_digit(value, spelled):
    """Each value is exactly halfway between two 17-digit strings that both read back to it (an exact x.25 or x.75)."""
    below, above = spelled[:-1] + str(int(spelled[-1]) - 1), spelled[:-1] + str(int(spelled[-1]) + 1)
    assert sum(float(text) == value for text in (below, spelled, above)) == 2
    assert canonical_json({"x": value}, what="m") == spec_writer.canonical_json({"x": value}) == f'{{"x":{spelled}}}'.encode()


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_spec_writer_float_digits_agree_with_varstore_for_every_float(value):
    """spec_writer searches correctly rounded %e strings; varstore uses repr: two algorithms, one §1.4 spelling."""
    assert spec_writer.canonical_json([value]) == canonical_json([value], what="m")


@pytest.mark.parametrize(
    "dtype, values", [("<f4", [1]), ("<f8", [0]), ("<c8", [[1, 0.0]]), ("<u2", [1.0]), ("|i1", [True])]
)
def test_notation_refuses_an_integer_among_float_values_and_a_float_among_integer_values(dtype, values):
    """§6.1: `1` is an integer and `1.0` a float everywhere in the notation, `$array` values included."""
    spelled = {"$array": {"dtype": dtype, "shape": [len(values)], "values": values}}
    with pytest.raises(ValueError):
        from_json(spelled)
    with pytest.raises(spec_writer.NotationError):
        spec_writer.from_notation(spelled)
