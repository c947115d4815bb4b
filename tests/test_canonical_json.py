"""Canonical JSON (§1.4): the exact bytes a writer writes, spelled out by hand from the spec text (never by
json.dumps), and the strict JSON rules readers and writers share, the integer range [-2**63, 2**64) among them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.format.metadata import MAX_METADATA_DEPTH, canonical_json, parse_strict_json
from varstore.format.manifest import MANIFEST_NAME, decode_manifest


def canonical(value) -> bytes:
    return canonical_json(value, what="test value")


def parse(raw: bytes):
    return parse_strict_json(raw, MAX_METADATA_DEPTH, what="test value", path="t")


@pytest.mark.parametrize("text, expected", [
    ("plain /slash", b'"plain /slash"'),
    ('quote " and backslash \\', b'"quote \\" and backslash \\\\"'),
    ("\b\t\n\f\r", b'"\\b\\t\\n\\f\\r"'),
    ("\x00\x01\x0b\x0e\x1b\x1f", b'"\\u0000\\u0001\\u000b\\u000e\\u001b\\u001f"'),  # lowercase hex
    ("\x7f", b'"\x7f"'),  # DEL is not a control character in JSON: raw
    ("\u2028\u2029", b'"\xe2\x80\xa8\xe2\x80\xa9"'),  # raw, though JavaScript source would need them escaped
    ("caf\u00e9 \u65e5\u672c", b'"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"'),
    ("\U0001f600", b'"\xf0\x9f\x98\x80"'),  # one 4-byte UTF-8 sequence, not a \\ud83d\\ude00 pair
])
def test_strings_are_raw_utf8_but_for_quote_backslash_and_c0_controls(text, expected):
    assert canonical(text) == expected
    assert parse(expected) == text


def test_member_names_sort_by_code_point_not_utf16_code_unit():
    value = {"\U0001f600": 1, "\uffff": 2, "\ue000": 3, "\u00e9": 4, "a": 5, "Z": 6, "": 7}
    # UTF-16 would put U+1F600 (d83d de00) before U+E000 and U+FFFF; code points put it last.
    assert canonical(value) == (
        b'{"":7,"Z":6,"a":5,"\xc3\xa9":4,"\xee\x80\x80":3,"\xef\xbf\xbf":2,"\xf0\x9f\x98\x80":1}'
    )


@pytest.mark.parametrize("number, expected", [
    (0, b"0"),
    (-1, b"-1"),
    (-(2**63), b"-9223372036854775808"),
    (2**64 - 1, b"18446744073709551615"),
    (1.0, b"1.0"),
    (100.0, b"100.0"),
    (0.1, b"0.1"),
    (-0.0, b"-0.0"),
    (0.0001, b"0.0001"),  # 10**-4 is the smallest magnitude written positionally
    (0.00001, b"1e-05"),  # below it: exponent form, sign and at least two digits
    (1.5e-7, b"1.5e-07"),
    (-2.5e-5, b"-2.5e-05"),
    (1e15, b"1000000000000000.0"),
    (9999999999999998.0, b"9999999999999998.0"),  # the largest float below 10**16: still positional
    (1e16, b"1e+16"),  # 10**16 and above: exponent form
    (123456789012345678.0, b"1.2345678901234568e+17"),  # shortest digits that read back to the same float64
    (1e100, b"1e+100"),
    (5e-324, b"5e-324"),
    (1.7976931348623157e308, b"1.7976931348623157e+308"),
])
def test_numbers_are_spelled_as_the_spec_says(number, expected):
    assert canonical(number) == expected
    parsed = parse(expected)
    assert type(parsed) is type(number) and parsed == number and str(parsed) == str(number)


def test_a_document_has_no_white_space_and_literals_as_such():
    value = {"b": [1, 2.0, None, True, False, []], "a": {"y": "x\n", "x": {}}}
    assert canonical(value) == b'{"a":{"x":{},"y":"x\\n"},"b":[1,2.0,null,true,false,[]]}'


def test_shard_metadata_block_is_exactly_the_canonical_bytes(tmp_path):
    user = {"\U0001f600": "\x1f\u2028", "\uffff": [1e16, 0.00001, -0.0], "ctl": "\x7f\t"}
    with varstore.Writer(tmp_path / "s", metadata=user) as writer:
        writer.append(b"x")
    index = (tmp_path / "s.index").read_bytes()
    expected = (
        b'{"codec":{},"user":{"ctl":"\x7f\\t","\xef\xbf\xbf":[1e+16,1e-05,-0.0],"\xf0\x9f\x98\x80":"\\u001f\xe2\x80\xa8"}}'
    )
    assert index[64 : 64 + len(expected) + 1] == expected + b"\x00"  # then zero padding
    assert varstore.open(tmp_path / "s").metadata == user


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def members_in_code_point_order(value) -> bool:
    if isinstance(value, dict):
        return list(value) == sorted(value) and all(map(members_in_code_point_order, value.values()))
    if isinstance(value, list):
        return all(map(members_in_code_point_order, value))
    return True


@given(json_values)
def test_canonical_json_reads_back_equal_and_re_encodes_to_the_same_bytes(value):
    raw = canonical(value)
    parsed = parse(raw)
    assert parsed == value
    assert members_in_code_point_order(parsed)
    assert canonical(parsed) == raw


@pytest.mark.parametrize("number", ["18446744073709551616", "-9223372036854775809", "1" + "0" * 5000])
def test_reader_refuses_json_integers_outside_the_range_naming_the_number(number):
    with pytest.raises(varstore.FormatError, match=rf"integer {number[:40]}.* is outside \[-2\*\*63, 2\*\*64\)"):
        parse(b'{"x":[' + number.encode() + b"]}")


def test_integers_at_the_bounds_and_floats_beyond_them_are_read():
    assert parse(b"[-9223372036854775808,18446744073709551615,-0,1e30,18446744073709551616.0]") == [
        -(2**63), 2**64 - 1, 0, 1e30, 2.0**64
    ]


@pytest.mark.parametrize("number, shown", [
    (2**64, "18446744073709551616"), (-(2**63) - 1, "-9223372036854775809"), (1 << 20000, "of 20001 bits")
], ids=["2**64", "-2**63-1", "2**20000"])
def test_writers_refuse_json_integers_outside_the_range_naming_the_number(tmp_path, number, shown):
    with pytest.raises(varstore.FormatError, match=rf"metadata holds the integer {shown}, outside"):
        varstore.Writer(tmp_path / "s", metadata={"x": [number]})
    with varstore.Writer(tmp_path / "a") as writer:
        writer.append(b"a")
    with pytest.raises(varstore.FormatError, match=rf"holds the integer {shown}, outside"):
        varstore.write_manifest(tmp_path, metadata={"x": {"y": number}})
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_writer_refuses_member_names_json_would_turn_into_strings_out_of_order(tmp_path):
    """Regression: metadata {10: 1, 9: 2} was written as {"9":2,"10":1} (sorted as integers, not by code point)
    and read back as {"9": 2, "10": 1}."""
    with pytest.raises(varstore.FormatError, match="member name 10: JSON object keys must be strings"):
        varstore.Writer(tmp_path / "s", metadata={10: 1, 9: 2})


def manifest_text(tmp_path) -> str:
    with varstore.Writer(tmp_path / "a") as writer:
        writer.append(b"a")
    varstore.write_manifest(tmp_path)
    return (tmp_path / MANIFEST_NAME).read_text()


@pytest.mark.parametrize("forge, problem", [
    (lambda text: text.replace('"metadata": {}', '"metadata": {"n": 18446744073709551616}'),
     r"integer 18446744073709551616 is outside"),
    (lambda text: text.replace('"metadata": {}', '"metadata": {"n": -9223372036854775809}'),
     r"integer -9223372036854775809 is outside"),
    (lambda text: "\ufeff" + text, "byte order mark"),
    (lambda text: text.replace('"metadata": {}', '"metadata": ' + "[" * 64 + "]" * 64), "nest 65 deep, over the limit of 64"),
], ids=["2**64", "-2**63-1", "bom", "depth-65"])
def test_manifest_json_outside_the_strict_rules_is_refused_naming_the_fact(tmp_path, forge, problem):
    forged = forge(manifest_text(tmp_path))
    with pytest.raises(varstore.FormatError, match=rf"manifest is not valid UTF-8 JSON: .*{problem}"):
        decode_manifest(forged.encode(), path="m")


def test_manifest_json_nested_64_deep_passes_the_json_rules(tmp_path):
    forged = manifest_text(tmp_path).replace('"metadata": {}', '"metadata": ' + "[" * 63 + "]" * 63)
    value = parse_strict_json(forged.encode(), MAX_METADATA_DEPTH, what="manifest", path="m")
    innermost = value["metadata"]
    for _ in range(62):
        (innermost,) = innermost
    assert innermost == []


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_writers_refuse_non_finite_floats_readers_would_refuse(tmp_path, number):
    with pytest.raises(varstore.FormatError, match="metadata must be JSON-serialisable: Out of range float values"):
        varstore.Writer(tmp_path / "s", metadata={"x": [number]})
    with pytest.raises(varstore.FormatError, match="Out of range float values"):
        canonical({"x": number})
