"""``varstore dump``: record selection, JSON lines, exact raw bytes, and the capped views for people."""

from __future__ import annotations

import json
import subprocess

import msgpack
import numpy as np
import pytest

import varstore
from varstore.format.notation import from_json

from .helpers_cli import (
    CONSOLE_SCRIPT, VECTOR_NAMES, VECTORS, assert_one_line_error, run, run_json_lines, run_script, write_dataset, write_shard,
)


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_dump_json_of_golden_vector_gives_its_records(capsys, name):
    expected = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    lines = run_json_lines(capsys, "dump", VECTORS / name)
    assert [line["record"] for line in lines] == expected["records"]
    assert [line["index"] for line in lines] == list(range(expected["record_count"]))


@pytest.fixture
def ten_records(tmp_path):
    """A dataset of 10 str records over 4 shards: record i is "record i" repeated i times."""
    return write_dataset(tmp_path / "ds", ["record %d " % index * index for index in range(10)], codec="str",
                         max_shard_records=3)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (["-i", "0", "-i", "-1", "-i", "4"], [0, 9, 4]),
        (["--range", "2:5"], [2, 3, 4]),
        (["--range=-2:"], [8, 9]),
        (["--range", ":3"], [0, 1, 2]),
        (["--range", "4:4"], []),
        (["--head", "2"], [0, 1]),
        (["--head", "50"], list(range(10))),
        (["--range", "3:11"], list(range(3, 10))),
        (["--range", "5:2"], []),
        (["--range=-20:2"], [0, 1]),
        (["--tail", "3"], [7, 8, 9]),
        ([], list(range(10))),
    ],
)
def test_selection_picks_the_records_asked_for(capsys, ten_records, selection, expected):
    lines = run_json_lines(capsys, "dump", ten_records, *selection)
    assert [line["index"] for line in lines] == expected
    assert [line["record"] for line in lines] == ["record %d " % index * index for index in expected]
    assert [line["size"] for line in lines] == [len(("record %d " % index * index).encode()) for index in expected]


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (["-i", "10"], "record 10 is out of range for 10 records"),
        (["-i", "-11"], "record -11 is out of range for 10 records"),
        (["--range", "two:three"], "--range takes A:B"),
    ],
)
def test_bad_selection_is_a_usage_error(capsys, ten_records, selection, message):
    code, out, err = run(capsys, "dump", ten_records, *selection)
    assert code == 2 and out == ""
    assert_one_line_error(code, err, message)


def test_raw_writes_exact_payload_bytes_for_every_codec(tmp_path):
    frames = [np.arange(6, dtype="<f4").reshape(3, 2) * index for index in range(4)]
    samples = [{"id": index, "blob": bytes([index]) * index} for index in range(4)]
    stores = {
        "bytes": (write_shard(tmp_path / "b", [b"\x00\xff", b"", b"\n\r\x1b"]), [b"\x00\xff", b"", b"\n\r\x1b"]),
        "ndarray": (write_dataset(tmp_path / "n", frames, codec="ndarray", dtype="float32", shape=[2], max_shard_records=3),
                    [frame.tobytes() for frame in frames]),
        "msgpack": (write_shard(tmp_path / "m", samples, codec="msgpack"), [msgpack.packb(sample) for sample in samples]),
    }
    for path, payloads in stores.values():
        result = run_script("dump", path, "--raw", "--range", "1:")
        assert result.returncode == 0, result.stderr
        assert result.stdout == b"".join(payloads[1:])


def test_hex_view_is_capped_at_the_limit(capsys, tmp_path):
    payload = bytes(range(256)) * 4
    shard = write_shard(tmp_path / "blobs", [b"hello", payload])
    code, out, _ = run(capsys, "dump", shard, "-i", "0")
    assert out.splitlines() == ["record 0: 5 bytes", "00000000: 6865 6c6c 6f                             hello"]
    code, out, _ = run(capsys, "dump", shard, "-i", "1", "--limit", "40")
    lines = out.splitlines()
    assert lines[0] == "record 1: 1,024 bytes"
    assert lines[1].startswith("00000000: 0001 0203 0405 0607 0809 0a0b 0c0d 0e0f  ")
    assert [line[:9] for line in lines[1:4]] == ["00000000:", "00000010:", "00000020:"]
    assert lines[3].split(": ")[1].startswith("2021 2223 2425 2627  ")
    assert lines[4].startswith(f"... {1024 - 40:,} more bytes")
    code, out, _ = run(capsys, "dump", shard, "-i", "1", "--limit", "0")
    assert len(out.splitlines()) == 1 + 1024 // 16


def test_text_is_quoted_escaped_and_capped(capsys, tmp_path):
    shard = write_shard(tmp_path / "text", ["two\nlines", "é" * 300], codec="str")
    code, out, _ = run(capsys, "dump", shard, "--limit", "100")
    lines = out.splitlines()
    assert lines[:2] == ["record 0: 9 bytes, 9 characters", '"two\\nlines"']
    assert lines[2] == "record 1: 600 bytes, 300 characters"
    assert lines[3] == '"' + "é" * 100 + '"... (200 more characters)'


def test_arrays_show_dtype_shape_and_their_first_values(capsys, tmp_path):
    shard = write_shard(tmp_path / "tokens", [np.arange(1000, dtype=np.uint16), np.array([7, 8], np.uint16)],
                        codec="ndarray", dtype="uint16")
    code, out, _ = run(capsys, "dump", shard)
    assert code == 0
    first, second = out.split("record 1: ")
    heading, values = first.split("\n", 1)
    assert heading == "record 0: 2,000 bytes, uint16 (1000,)"
    shown, note = values.split("]")
    assert [int(value) for value in shown.strip("[ \n").split()] == list(range(256))  # the default --limit
    assert note == f" ... ({1000 - 256} more elements)\n"
    assert second.splitlines() == ["4 bytes, uint16 (2,)", "[7 8]"]


def test_structured_sample_shows_fields_with_bytes_and_arrays_abridged(capsys, tmp_path):
    sample = {"name": "cat.jpg", "image": bytes(range(40)), "mask": np.arange(6, dtype=np.int32).reshape(2, 3),
              "labels": [1, 2], "caption": "a cat " * 30}
    shard = write_shard(tmp_path / "samples", [sample], codec="msgpack")
    code, out, _ = run(capsys, "dump", shard)
    assert code == 0
    assert out.splitlines()[1:] == [
        "{",
        '  "name": "cat.jpg",',
        f'  "image": <40 bytes: {bytes(range(16)).hex()}...>,',
        '  "mask": <ndarray int32 (2, 3): [[0 1 2] [3 4 5]]>,',
        '  "labels": [1, 2],',
        '  "caption": ' + json.dumps("a cat " * 30),
        "}",
    ]


def test_damaged_record_is_an_error_naming_it(capsys, tmp_path):
    padding = bytes(5000)  # keeps record 1 out of the first and last 4 KiB, which opening checks
    shard = write_shard(tmp_path / "samples", [{"a": padding}, {"b": 2}, {"c": padding}], codec="msgpack")
    with varstore.open(shard) as reader:
        start = int(reader.offsets[1])
    with open(tmp_path / "samples.data", "r+b") as file:
        file.seek(start)
        file.write(b"\xc1")  # a byte msgpack never uses
    code, _, err = run(capsys, "dump", shard, "-i", "1")
    assert code == 1
    assert_one_line_error(code, err, "record 1 does not decode as msgpack")


def _same(left, right) -> bool:
    """Equality that counts NaN equal to NaN, through dicts, lists and arrays."""
    if isinstance(left, np.ndarray):
        return isinstance(right, np.ndarray) and left.dtype == right.dtype and np.array_equal(left, right, equal_nan=True)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    if isinstance(left, list):
        return isinstance(right, list) and len(left) == len(right) and all(map(_same, left, right))
    if isinstance(left, float) and isinstance(right, float):
        return left == right or (left != left and right != right)
    return left == right


NON_FINITE = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize(
    ("options", "records"),
    [({"codec": "ndarray", "dtype": "float16"}, [np.array([1.5, np.nan, np.inf, -np.inf], np.float16)]),
     ({"codec": "ndarray", "dtype": "float32", "shape": [2]}, [np.array([[np.nan, 0.25], [-np.inf, np.inf]], np.float32)]),
     ({"codec": "ndarray", "dtype": "complex64"}, [np.array([complex(np.nan, 1), complex(2, -np.inf)], np.complex64)]),
     ({"codec": "msgpack"}, [{"loss": np.nan, "values": [np.inf, -np.inf, 0.5], "scale": np.array(np.inf, np.float32),
                             "mask": np.array(NON_FINITE, np.float64)}, [np.nan]])],
)
def test_dump_json_spells_nan_and_infinities_as_strict_json_that_reads_back(capsys, tmp_path, options, records):
    shard = write_shard(tmp_path / "floats", records, **options)
    lines = run_json_lines(capsys, "dump", shard)  # parsed strictly: a bare NaN or Infinity fails here
    decoded = [from_json(line["record"]) for line in lines]
    assert len(decoded) == len(records) and all(map(_same, decoded, records))


def test_non_finite_float_spelling_is_the_one_the_spec_gives(capsys, tmp_path):
    shard = write_shard(tmp_path / "floats", [{"a": np.nan, "b": [np.inf, -np.inf]}, np.array([np.nan], np.float32)],
                        codec="msgpack")
    lines = run_json_lines(capsys, "dump", shard)
    assert lines[0]["record"] == {"a": {"$float": "NaN"}, "b": [{"$float": "Infinity"}, {"$float": "-Infinity"}]}
    assert lines[1]["record"] == {"$array": {"dtype": "<f4", "shape": [1], "values": [{"$float": "NaN"}]}}


def test_maps_with_integer_keys_keep_every_member_in_json(capsys, tmp_path):
    from varstore.format.notation import from_json

    record = {1: "int key", "1": "str key", "inner": {2: [b"\x00"]}}
    shard = write_shard(tmp_path / "keys", [record], codec="msgpack")
    (line,) = run_json_lines(capsys, "dump", shard)
    assert line["record"] == {"$map": [[1, "int key"], ["1", "str key"], ["inner", {"$map": [[2, [{"$bytes": "00"}]]]}]]}
    assert from_json(line["record"]) == record


def _nested(depth: int, make) -> object:
    value: object = []
    for _ in range(depth - 1):
        value = make(value)
    return value


@pytest.mark.parametrize(("make", "opening", "closing"), [(lambda inner: [inner], "[", "]"), (lambda inner: {"k": inner}, '{"k": ', "}")],
                         ids=["lists", "maps"])
@pytest.mark.parametrize("style", [[], ["--json"]], ids=["text", "json"])
def test_deepest_record_the_writer_accepts_is_dumped(capsys, tmp_path, make, opening, closing, style):
    from varstore.format.msgpack_bounds import MAX_DEPTH

    shard = write_shard(tmp_path / "deep", [_nested(MAX_DEPTH, make)], codec="msgpack")
    code, out, err = run(capsys, "dump", shard, *style)
    assert code == 0, err
    if style:  # spelled out by hand: parsing it back here would hit this process's own recursion limit
        assert out.endswith('"record": ' + opening * (MAX_DEPTH - 1) + "[]" + closing * (MAX_DEPTH - 1) + "}\n")


def test_dump_with_standard_output_closed_is_one_line(tmp_path):
    shard = write_shard(tmp_path / "docs", [b"abc"])
    for style in (["--raw"], ["--json"], []):
        result = subprocess.run(f'exec "{CONSOLE_SCRIPT}" dump "{shard}" {" ".join(style)} >&-', shell=True,
                                capture_output=True, timeout=120)
        assert result.returncode == 1
        assert_one_line_error(result.returncode, result.stderr.decode(), "varstore dump: standard output is closed")
