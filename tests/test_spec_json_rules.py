"""§1.4's JSON number and member-name rules, §3.1's case-insensitive names and §6.1's member order, judged by the
spec-only reader and by varstore alike (the ambiguities an attack on spec 1.1 found; a reader in another language
must decide them the same way)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

import varstore
from varstore.format import header as fmt
from varstore.format.notation import from_json, to_json

from . import spec_reader
from varstore.format.metadata import canonical_json, parse_strict_json

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
