"""The golden vectors (spec/FORMAT.md §6) against their descriptions, the independent expected values.

Each description spec/vectors/NAME.json was written by hand, not by varstore. Three implementations must
agree with it: tests/spec_writer.py (the spec alone) writes the vector's bytes, tests/spec_reader.py (the
spec alone) reads them back to the description, and varstore both writes the same bytes (through
tools/make_vectors.py) and reads them back to the description.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest

import varstore
from varstore.format.notation import to_json

from . import spec_reader, spec_writer

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors"
NAMES = sorted(path.stem for path in VECTORS.glob("*.json"))
HEADER_FACTS = ("format_version", "record_count", "data_size", "data_crc32c")


def _make_vectors():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "tools" / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _description(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))


def _notation_text(value) -> str:
    """Records compared as JSON text: 1 and 1.0 differ, -0.0 is not 0.0, and map order counts."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _json_text(value) -> str:
    """Metadata compared as JSON text, but with members in one order: a JSON object has none."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True)


def test_there_are_vectors_for_every_codec():
    assert {_description(name)["codec"] for name in NAMES} == set(spec_writer.CODEC_IDS)


def test_crc32c_check_value_matches_the_spec():
    assert spec_reader.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("module", ["spec_reader", "spec_writer"])
def test_spec_side_code_imports_nothing_from_varstore(module):
    tree = ast.parse((ROOT / "tests" / f"{module}.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("varstore") for name in imported)
    if module == "spec_writer":  # its JSON and MessagePack encoders are its own
        assert not imported & {"json", "msgpack"}


@pytest.mark.parametrize(
    "value, spelling",
    [
        (1e16, "1e+16"), (1e15, "1000000000000000.0"), (0.0001, "0.0001"), (1e-05, "1e-05"), (1.5e-07, "1.5e-07"),
        (-0.0, "-0.0"), (0.0, "0.0"), (5e-324, "5e-324"), (0.1, "0.1"), (1.0, "1.0"), (-2.5, "-2.5"),
        (0.00012345, "0.00012345"), (123456.789, "123456.789"), (9999999999999998.0, "9999999999999998.0"),
        (1.2345678901234568e17, "1.2345678901234568e+17"), (1e100, "1e+100"), (-1e-7, "-1e-07"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_spec_writer_spells_floats_as_section_1_4_says(value, spelling):
    assert spec_writer.json_float(value) == spelling


def test_spec_writer_escapes_and_orders_json_as_section_1_4_says():
    value = {"\U0001f600": 1, "\uff61": 2, "b": [True, None], "a": "\"\\/\x00\b\t\n\x0b\f\r\x1f\x7f\u2028é"}
    expected = '{"a":"\\"\\\\/\\u0000\\b\\t\\n\\u000b\\f\\r\\u001f\x7f\u2028é","b":[true,null],"\uff61":2,"\U0001f600":1}'
    assert spec_writer.canonical_json(value) == expected.encode("utf-8")


@pytest.mark.parametrize(
    "notation, hex_bytes",
    [
        (127, "7f"), (128, "cc80"), (256, "cd0100"), (65536, "ce00010000"), (1 << 32, "cf0000000100000000"),
        (-32, "e0"), (-33, "d0df"), (-129, "d1ff7f"), (-32769, "d2ffff7fff"), (-(1 << 31) - 1, "d3ffffffff7fffffff"),
        (1.0, "cb3ff0000000000000"), ({"$float": "NaN"}, "cb7ff8000000000000"), ("a" * 31, "bf" + "61" * 31),
        ("é" * 16, "d920" + "c3a9" * 16), ({"$bytes": ""}, "c400"), ([0] * 16, "dc0010" + "00" * 16),
        ({"$map": [[1, None], ["1", None]]}, "8201c0a131c0"), ({"b": 1, "a": 2}, "82a16201a16102"),
        ({"$array": {"dtype": "|u1", "shape": [3], "values": [1, 2, 3]}}, "d801" + "037c753101" + "0300000000000000" + "010203"),
        ({"$array": {"dtype": "<f4", "shape": [], "values": [{"$float": "NaN"}]}}, "c7090103" + "3c6634" + "00" + "0000c07f"),
    ],
)
def test_spec_writer_msgpack_uses_the_smallest_forms_of_section_2_2(notation, hex_bytes):
    assert spec_writer.msgpack_bytes(spec_writer.from_notation(notation)).hex() == hex_bytes


@pytest.mark.parametrize(
    "invalid",
    [
        {"$foo": 1}, {"$bytes": "AB"}, {"$bytes": "00", "x": 1}, {"$float": "nan"}, {"$map": [["a", 1]]}, {"$map": []},
        {"$map": [[1, 0], [1, 2]]}, {"$array": {"dtype": "<f4", "shape": [1], "values": [0.1]}}, 1 << 64, -(1 << 63) - 1,
    ],
)
def test_spec_writer_refuses_what_section_6_1_calls_invalid(invalid):
    with pytest.raises(spec_writer.NotationError):
        spec_writer.from_notation(invalid)


@pytest.mark.parametrize("name", NAMES)
def test_spec_writer_reproduces_vector_byte_for_byte(name):
    expected = _description(name)
    shard = spec_writer.write_shard(expected)
    assert shard.index == (VECTORS / f"{name}.index").read_bytes()
    assert shard.data == (VECTORS / f"{name}.data").read_bytes()
    assert spec_writer.header_facts(shard) == {field: expected[field] for field in HEADER_FACTS}


@pytest.mark.parametrize("name", NAMES)
def test_library_writer_reproduces_vector_byte_for_byte(name, tmp_path):
    _make_vectors().write_vector(tmp_path / name, _description(name))
    for suffix in (".index", ".data"):
        assert (tmp_path / f"{name}{suffix}").read_bytes() == (VECTORS / f"{name}{suffix}").read_bytes(), suffix


@pytest.mark.parametrize("name", NAMES)
def test_spec_only_reader_reads_vector_back_to_its_description(name):
    expected = _description(name)
    shard = spec_reader.read_shard(str(VECTORS / name))
    assert shard["codec"] == spec_writer.CODEC_IDS[expected["codec"]]
    for field in ("codec_params", "metadata", "record_checksums", *HEADER_FACTS):
        assert _json_text(shard[field]) == _json_text(expected[field]), field
    assert shard["data_crc32c_recorded"] == expected.get("data_crc32c_recorded", True)
    for index, (record, spelled) in enumerate(zip(shard["records"], expected["records"], strict=True)):
        assert _notation_text(spec_reader.notation(record)) == _notation_text(spelled), f"record {index}"


@pytest.mark.parametrize("name", NAMES)
def test_library_reads_vector_back_to_its_description(name):
    expected = _description(name)
    with varstore.open(VECTORS / name) as reader:
        reader.verify()
        assert reader.codec == expected["codec"]
        assert reader.header.has_record_checksums == expected["record_checksums"]
        assert reader.header.data_crc_recorded == expected.get("data_crc32c_recorded", True)
        assert _json_text(reader.metadata) == _json_text(expected["metadata"])
        assert len(reader) == expected["record_count"]
        for index, (record, spelled) in enumerate(zip(reader, expected["records"], strict=True)):
            assert _notation_text(to_json(record)) == _notation_text(spelled), f"record {index}"


def test_library_reads_quiet_nans_of_each_width_from_the_vectors():
    """The notation's "NaN" is the quiet NaN of the array's width; the vector holds exactly those bits."""
    data = (VECTORS / "ndarray-float32-keypoints.data").read_bytes()
    assert bytes.fromhex("0000c07f") in data
    with varstore.open(VECTORS / "ndarray-float32-keypoints") as reader:
        assert math.isnan(reader[0][1, 0, 0])


def test_make_vectors_refuses_a_shard_whose_header_disagrees_with_its_description(tmp_path):
    make_vectors = _make_vectors()
    description = _description("bytes-basic")
    make_vectors.write_vector(tmp_path / "bytes-basic", description)
    assert make_vectors.header_disagreements(tmp_path / "bytes-basic", description) == []
    wrong = {**description, "data_crc32c": description["data_crc32c"] ^ 1, "record_count": 5}
    assert len(make_vectors.header_disagreements(tmp_path / "bytes-basic", wrong)) == 2
