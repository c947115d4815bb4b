"""``varstore convert``: every source format round-trips through ``dump``; bad input fails with its line or row named."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import varstore
from varstore.cli import sources
from varstore.record_json import from_json

from .helpers_cli import assert_one_line_error, run, run_json, run_json_lines, run_script

SEPARATOR = 9


def _dumped(capsys, dataset) -> list:
    """The records of `dataset` as `dump --json` gives them, decoded back."""
    return [from_json(line["record"]) for line in run_json_lines(capsys, "dump", dataset)]


def _convert(capsys, *args) -> None:
    code, out, err = run(capsys, "convert", *args, "--quiet")
    assert code == 0, err
    assert out.startswith("wrote ")


def test_npy_rows_become_records(capsys, tmp_path):
    frames = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    np.save(tmp_path / "frames.npy", frames)
    _convert(capsys, tmp_path / "frames.npy", tmp_path / "ds")
    records = _dumped(capsys, tmp_path / "ds")
    assert len(records) == 5 and all(np.array_equal(record, frame) for record, frame in zip(records, frames))
    assert run_json(capsys, "info", tmp_path / "ds")["codec_params"] == {"dtype": "<f4", "shape": [2]}


def test_npy_split_by_offsets_file(capsys, tmp_path):
    tokens = np.arange(10, dtype=np.uint32)
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "offsets.npy", np.array([0, 3, 3, 9, 10]))
    _convert(capsys, tmp_path / "tokens.npy", tmp_path / "ds", "--offsets", tmp_path / "offsets.npy")
    assert [record.tolist() for record in _dumped(capsys, tmp_path / "ds")] == [[0, 1, 2], [], [3, 4, 5, 6, 7, 8], [9]]


@pytest.mark.parametrize(
    ("offsets", "message"),
    [([0, 5, 3, 10], "offsets decrease after position 1"), ([0, 4, 9], "from 0 to the array's 10 rows"),
     ([[0, 10]], "1-D integer array")],
)
def test_bad_offsets_are_refused_before_anything_is_written(capsys, tmp_path, offsets, message):
    np.save(tmp_path / "tokens.npy", np.arange(10, dtype=np.uint32))
    np.save(tmp_path / "offsets.npy", np.array(offsets))
    code, _, err = run(capsys, "convert", tmp_path / "tokens.npy", tmp_path / "ds", "--offsets", tmp_path / "offsets.npy")
    assert_one_line_error(code, err, "offsets.npy", message)
    assert not (tmp_path / "ds").exists()


def test_object_npy_is_refused(capsys, tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, _, err = run(capsys, "convert", tmp_path / "objects.npy", tmp_path / "ds")
    assert_one_line_error(code, err, "objects.npy", "not an .npy array that can be memory-mapped")


def _split_at_separator(tokens: list[int]) -> list[list[int]]:
    documents, current = [], []
    for token in tokens:
        if token == SEPARATOR:
            documents.append(current)
            current = []
        else:
            current.append(token)
    return documents + ([current] if current else [])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1, 2, 3, SEPARATOR, 65535]), max_size=60), st.sampled_from([2, 6, 14]))
def test_token_file_splits_into_documents_across_chunk_boundaries(capsys, tmp_path_factory, monkeypatch, tokens, chunk_bytes):
    monkeypatch.setattr(sources, "_CHUNK_BYTES", chunk_bytes)
    directory = tmp_path_factory.mktemp("tokens")
    np.array(tokens, np.uint16).tofile(directory / "train.bin")
    _convert(capsys, directory / "train.bin", directory / "ds", "--dtype", "uint16", "--separator", SEPARATOR)
    assert [record.tolist() for record in _dumped(capsys, directory / "ds")] == _split_at_separator(tokens)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--dtype", "uint16"], "needs --dtype (e.g. uint16) and --separator"),
     (["--dtype", "float32", "--separator", "1"], "--dtype must be an integer type"),
     (["--dtype", "uint16", "--separator", "70000"], "--separator 70000 does not fit uint16"),
     (["--dtype", "uint16", "--separator", "1", "--field", "text"], "--field does not apply to tokens sources")],
)
def test_token_options_are_checked(capsys, tmp_path, arguments, message):
    np.arange(4, dtype=np.uint16).tofile(tmp_path / "train.bin")
    code, _, err = run(capsys, "convert", tmp_path / "train.bin", tmp_path / "ds", *arguments)
    assert code == 2
    assert_one_line_error(code, err, message)


def test_token_file_of_odd_size_is_refused(capsys, tmp_path):
    (tmp_path / "train.bin").write_bytes(b"\x01\x00\x02")
    code, _, err = run(capsys, "convert", tmp_path / "train.bin", tmp_path / "ds", "--dtype", "uint16", "--separator", "0")
    assert_one_line_error(code, err, "train.bin", "3 bytes is not a whole number of 2-byte uint16 tokens")


SAMPLES = [{"id": 1, "text": "first", "tags": ["a"]}, {"id": 2, "text": "zweite ü", "score": 0.5, "extra": None}, [1, 2]]


def test_json_lines_become_structured_samples(capsys, tmp_path):
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(sample) for sample in SAMPLES) + "\n\n", encoding="utf-8")
    _convert(capsys, tmp_path / "docs.jsonl", tmp_path / "ds")
    assert _dumped(capsys, tmp_path / "ds") == SAMPLES


@pytest.mark.parametrize(("codec", "expected"), [("str", ["first", "zweite ü"]), ("bytes", [b"first", "zweite ü".encode()])])
def test_json_lines_field_becomes_text_or_bytes(capsys, tmp_path, codec, expected):
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(sample) for sample in SAMPLES[:2]), encoding="utf-8")
    _convert(capsys, tmp_path / "docs.jsonl", tmp_path / "ds", "--field", "text", "--codec", codec)
    assert _dumped(capsys, tmp_path / "ds") == expected


@pytest.mark.parametrize(
    ("lines", "arguments", "message"),
    [(['{"text": "a"}', '{"text": "b"', '{"text": "c"}'], [], "docs.jsonl, line 2: not valid JSON"),
     (['{"text": "a"}', '{"body": "b"}'], ["--field", "text"], "docs.jsonl, line 2: no field 'text'"),
     (['{"text": 5}'], ["--field", "text"], "line 1, field 'text': the field holds int, expected text"),
     (['{"n": 123456789012345678901234567890}'], [], "docs.jsonl, line 1:")],
)
def test_bad_json_lines_name_the_line_and_leave_no_dataset(capsys, tmp_path, lines, arguments, message):
    (tmp_path / "docs.jsonl").write_text("\n".join(lines), encoding="utf-8")
    code, _, err = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "ds", *arguments)
    assert_one_line_error(code, err, message)
    assert not os.path.exists(tmp_path / "ds" / "manifest.json")
    assert os.listdir(tmp_path / "ds") == []


def test_text_lines_become_records_without_line_endings(capsys, tmp_path):
    (tmp_path / "lines.txt").write_bytes("one\r\n\ntwo ü\nlast".encode())
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds")
    assert _dumped(capsys, tmp_path / "ds") == ["one", "", "two ü", "last"]


def test_text_that_is_not_utf8_is_refused_unless_kept_as_bytes(capsys, tmp_path):
    (tmp_path / "lines.txt").write_bytes(b"fine\n\xff\xfe\n")
    code, _, err = run(capsys, "convert", tmp_path / "lines.txt", tmp_path / "ds")
    assert_one_line_error(code, err, "lines.txt, line 2: not valid UTF-8")
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "raw", "--codec", "bytes")
    assert _dumped(capsys, tmp_path / "raw") == [b"fine", b"\xff\xfe"]


def test_folder_files_become_named_samples_in_path_order(capsys, tmp_path):
    files = {"b.jpg": b"\xff\xd8jpeg", "a/z.txt": b"zed", "a/b/c.bin": bytes(range(5)), "0.txt": b""}
    for name, data in files.items():
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / name).write_bytes(data)
    _convert(capsys, tmp_path / "images", tmp_path / "ds")
    expected_order = ["0.txt", "a/b/c.bin", "a/z.txt", "b.jpg"]
    assert _dumped(capsys, tmp_path / "ds") == [{"name": name, "data": files[name]} for name in expected_order]


def test_parquet_rows_and_columns(capsys, tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    table = pyarrow.table({"text": ["a", "bb", "ccc"], "blob": [b"\x00", b"", b"\xff\xff"], "label": [1, 2, 3]})
    parquet.write_table(table, tmp_path / "rows.parquet", row_group_size=2)
    _convert(capsys, tmp_path / "rows.parquet", tmp_path / "rows")
    assert _dumped(capsys, tmp_path / "rows") == table.to_pylist()
    _convert(capsys, tmp_path / "rows.parquet", tmp_path / "text", "--field", "text")
    assert _dumped(capsys, tmp_path / "text") == ["a", "bb", "ccc"]
    _convert(capsys, tmp_path / "rows.parquet", tmp_path / "blob", "--field", "blob")
    assert _dumped(capsys, tmp_path / "blob") == [b"\x00", b"", b"\xff\xff"]
    code, _, err = run(capsys, "convert", tmp_path / "rows.parquet", tmp_path / "none", "--field", "caption")
    assert_one_line_error(code, err, "no column 'caption'", "text, blob, label")


def test_parquet_without_pyarrow_names_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    code, _, err = run(capsys, "convert", tmp_path / "rows.parquet", tmp_path / "ds")
    assert_one_line_error(code, err, "converting Parquet needs pyarrow.parquet", "pip install 'varstore[parquet]'")


def test_shard_limits_split_the_output(capsys, tmp_path):
    (tmp_path / "lines.txt").write_text("".join(f"line {index:03d}\n" for index in range(100)))
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "by-records", "--max-shard-records", "30")
    assert [shard["record_count"] for shard in run_json(capsys, "info", tmp_path / "by-records")["shards"]] == [30, 30, 30, 10]
    (tmp_path / "wide.txt").write_text("".join(f"{index:03d}" + "x" * 97 + "\n" for index in range(25)))
    _convert(capsys, tmp_path / "wide.txt", tmp_path / "by-bytes", "--max-shard-bytes", "1K")
    shards = run_json(capsys, "info", tmp_path / "by-bytes")["shards"]
    assert [shard["data_size"] for shard in shards] == [1000, 1000, 500]  # ten 100-byte records fit in 1,024 bytes


def test_existing_dataset_needs_overwrite(capsys, tmp_path):
    (tmp_path / "lines.txt").write_text("a\nb\n")
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds")
    code, _, err = run(capsys, "convert", tmp_path / "lines.txt", tmp_path / "ds")
    assert_one_line_error(code, err, "already exists")
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds", "--overwrite", "--metadata", '{"source": "lines.txt"}')
    assert run_json(capsys, "info", tmp_path / "ds")["metadata"] == {"source": "lines.txt"}


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [("data.csv", [], "cannot tell the format of"), ("data.txt", ["--offsets", "o.npy"], "--offsets does not apply to text"),
     ("data.jsonl", ["--codec", "bytes"], "--codec applies to JSON Lines only with --field"),
     ("data.txt", ["--format", "folder"], "the folder format needs a folder")],
)
def test_options_that_do_not_fit_the_source_are_usage_errors(capsys, tmp_path, name, arguments, message):
    (tmp_path / name).write_text("x\n")
    code, _, err = run(capsys, "convert", tmp_path / name, tmp_path / "ds", *arguments)
    assert code == 2
    assert_one_line_error(code, err, message)


def test_convert_then_dump_end_to_end_through_the_console_script(tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"text": "hello"}\n{"text": "world"}\n')
    converted = run_script("convert", tmp_path / "docs.jsonl", tmp_path / "ds", "--field", "text")
    assert converted.returncode == 0, converted.stderr
    assert converted.stdout.decode().startswith(f"wrote 2 records in 1 shard (10 bytes) to {tmp_path / 'ds'} in ")
    dumped = run_script("dump", tmp_path / "ds", "--raw")
    assert dumped.stdout == b"helloworld"
    assert len(varstore.open(tmp_path / "ds")) == 2


def test_folder_with_a_pipe_in_it_is_refused_without_hanging(capsys, tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"jpeg")
    os.mkfifo(tmp_path / "images" / "b.pipe")
    code, _, err = run(capsys, "convert", tmp_path / "images", tmp_path / "ds")
    assert_one_line_error(code, err, "b.pipe: not a regular file")
    assert os.listdir(tmp_path / "ds") == []
