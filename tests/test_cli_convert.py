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
from varstore.conversion import sources
from varstore.format.notation import from_json

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


def _split_at_separator(tokens: list[int], *, drop: bool) -> list[list[int]]:
    """Documents as the README defines them: each separator ends its document, as its last token unless dropped."""
    documents, current = [], []
    for token in tokens:
        if token == SEPARATOR:
            documents.append(current if drop else current + [token])
            current = []
        else:
            current.append(token)
    return documents + ([current] if current else [])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1, 2, 3, SEPARATOR, 65535]), max_size=60), st.sampled_from([2, 6, 14]), st.booleans())
def test_token_file_splits_into_documents_across_chunk_boundaries(capsys, tmp_path_factory, monkeypatch, tokens, chunk_bytes, drop):
    monkeypatch.setattr(sources, "_CHUNK_BYTES", chunk_bytes)
    directory = tmp_path_factory.mktemp("tokens")
    np.array(tokens, np.uint16).tofile(directory / "train.bin")
    _convert(capsys, directory / "train.bin", directory / "ds", "--dtype", "uint16", "--separator", SEPARATOR,
             *(["--drop-separator"] if drop else []))
    assert [record.tolist() for record in _dumped(capsys, directory / "ds")] == _split_at_separator(tokens, drop=drop)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--dtype", "uint16"], "a token file needs --separator (the end-of-document token id)"),
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
    assert not (tmp_path / "ds").exists()


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
    assert_one_line_error(code, err, "is already there", "--overwrite")
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds", "--overwrite", "--metadata", '{"source": "lines.txt"}')
    assert run_json(capsys, "info", tmp_path / "ds")["metadata"] == {"source": "lines.txt"}


def test_rerun_after_a_killed_convert_is_told_the_option_the_command_line_has(capsys, tmp_path):
    (tmp_path / "lines.txt").write_text("a\nb\n")
    writer = varstore.ShardedWriter(tmp_path / "ds", codec="str", max_shard_records=1)
    writer.extend(["a", "b"])  # a shard committed, no manifest: as a killed convert leaves it
    del writer
    code, _, err = run(capsys, "convert", tmp_path / "lines.txt", tmp_path / "ds")
    assert_one_line_error(code, err, "interrupted writer", "--overwrite")
    assert "resume=True" not in err
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds", "--overwrite")
    assert list(varstore.open(tmp_path / "ds")) == ["a", "b"]


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
    assert not (tmp_path / "ds").exists()


def _npy_header_only(path, shape) -> None:
    """An .npy file of `shape` whose rows hold no bytes: a header and nothing else."""
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, {"descr": "<u1", "fortran_order": False, "shape": shape})


@pytest.mark.parametrize("shape", [(2**40, 0), (3, 0, 2**50), (0, 2**40)])
def test_npy_claiming_more_rows_than_its_bytes_is_refused_before_writing(capsys, tmp_path, shape):
    _npy_header_only(tmp_path / "huge.npy", shape)
    code, _, err = run(capsys, "convert", tmp_path / "huge.npy", tmp_path / "ds")
    assert_one_line_error(code, err, "huge.npy", f"dimension of {max(shape):,}", "in a file of 128 bytes")
    assert code == 1 and not (tmp_path / "ds").exists()


def test_npy_of_empty_rows_within_its_size_is_converted(capsys, tmp_path):
    _npy_header_only(tmp_path / "empty-rows.npy", (100, 0))
    _convert(capsys, tmp_path / "empty-rows.npy", tmp_path / "ds")
    assert [record.shape for record in _dumped(capsys, tmp_path / "ds")] == [(0,)] * 100


def _npz_named_npy(path) -> None:
    np.savez(path.with_suffix(".npz"), a=np.arange(3))
    path.with_suffix(".npz").rename(path)


@pytest.mark.parametrize(
    ("write", "message"),
    [(lambda path: path.write_bytes(b""), "empty file, not an .npy array"),
     (_npz_named_npy, "an .npz archive of several arrays, not an .npy array"),
     (lambda path: path.write_bytes(b"\x93NUMPY\x01\x00\x76\x00{'descr'"), "not an .npy array"),
     (lambda path: path.write_bytes(b"plain text, not numpy at all"), "not an .npy array")],
)
def test_file_that_is_not_an_npy_array_is_one_line(capsys, tmp_path, write, message):
    write(tmp_path / "rows.npy")
    code, _, err = run(capsys, "convert", tmp_path / "rows.npy", tmp_path / "ds")
    assert_one_line_error(code, err, "rows.npy", message)
    assert not (tmp_path / "ds").exists()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_damaged_npy_headers_are_refused_in_one_line_or_converted(capsys, tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("npy")
    path = directory / "rows.npy"
    np.save(path, np.arange(12, dtype=np.int16).reshape(4, 3))
    damaged = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(damaged)))
    path.write_bytes(bytes(damaged[:cut]))
    code, _, err = run(capsys, "convert", path, directory / "ds")
    if code == 0:
        assert varstore.open(directory / "ds").verify() is None
    else:
        assert_one_line_error(code, err, "rows.npy")
        assert not (directory / "ds").exists()


def test_json_lines_nested_too_deeply_name_the_line(capsys, tmp_path):
    (tmp_path / "deep.jsonl").write_text('{"ok": 1}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    code, _, err = run(capsys, "convert", tmp_path / "deep.jsonl", tmp_path / "ds")
    assert_one_line_error(code, err, "deep.jsonl, line 2: JSON nested too deeply")
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [('{"text": "\\ud800"}', "line 1: "), (b'{"a": "\xff"}', "line 1: not valid JSON"), ("[" * 600 + "]" * 600, "line 1: ")],
)
def test_json_lines_the_writer_refuses_name_the_line(capsys, tmp_path, line, message):
    (tmp_path / "docs.jsonl").write_bytes(line if isinstance(line, bytes) else line.encode())
    code, _, err = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "ds")
    assert_one_line_error(code, err, "docs.jsonl", message)


@pytest.mark.parametrize(("name", "arguments"), [("lines.txt", []), ("lines.txt", ["--codec", "bytes"]), ("docs.jsonl", [])])
def test_line_over_max_record_bytes_is_refused_with_bounded_reads(capsys, tmp_path, monkeypatch, name, arguments):
    (tmp_path / name).write_bytes(b'"short"\n"' + b"x" * 5000 + b'"\n"after"\n')
    longest_read = []
    real_open = open

    class MeasuredFile:
        def __init__(self, file):
            self.file = file

        def readline(self, limit=-1):
            assert limit > 0, "a line must be read with a bound"
            line = self.file.readline(limit)
            longest_read.append(len(line))
            return line

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(sources, "open", lambda path, mode: MeasuredFile(real_open(path, mode)), raising=False)
    code, _, err = run(capsys, "convert", tmp_path / name, tmp_path / "ds", "--max-record-bytes", "1K", *arguments)
    assert_one_line_error(code, err, f"{name}, line 2: longer than --max-record-bytes (1,024 bytes)")
    assert max(longest_read) <= 1024 + 2
    assert not (tmp_path / "ds").exists()


def test_line_of_exactly_max_record_bytes_with_crlf_is_kept(capsys, tmp_path):
    (tmp_path / "lines.txt").write_bytes(b"x" * 1024 + b"\r\n" + b"y" * 1024)
    _convert(capsys, tmp_path / "lines.txt", tmp_path / "ds", "--max-record-bytes", "1K")
    assert _dumped(capsys, tmp_path / "ds") == ["x" * 1024, "y" * 1024]


def test_folder_file_over_max_record_bytes_is_refused_before_it_is_read(capsys, tmp_path, monkeypatch):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"a" * 1024)
    (tmp_path / "images" / "b.jpg").write_bytes(b"b" * 1025)
    reads = []
    monkeypatch.setattr(sources.FolderSource, "_record", lambda self, path, *framing, real=sources.FolderSource._record: reads.append(path) or real(self, path, *framing))
    code, _, err = run(capsys, "convert", tmp_path / "images", tmp_path / "ds", "--max-record-bytes", "1K")
    assert_one_line_error(code, err, "b.jpg: 1,025 bytes is over --max-record-bytes (1,024)")
    assert not (tmp_path / "ds").exists()
    _convert(capsys, tmp_path / "images", tmp_path / "ds", "--max-record-bytes", "2K")
    assert [record["name"] for record in _dumped(capsys, tmp_path / "ds")] == ["a.jpg", "b.jpg"]


def test_folder_file_read_takes_at_most_the_limit_plus_one_byte(capsys, tmp_path, monkeypatch):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.bin").write_bytes(b"a" * 4096)
    growing = os.stat(tmp_path / "images" / "a.bin").st_ino

    def fstat_before_it_grew(fd, real=os.fstat):
        status = real(fd)
        return os.stat_result(status[:6] + (0,) + status[7:]) if status.st_ino == growing else status

    monkeypatch.setattr(os, "fstat", fstat_before_it_grew)  # the file looks empty when checked, then holds 4 KiB
    code, _, err = run(capsys, "convert", tmp_path / "images", tmp_path / "ds", "--max-record-bytes", "1K")
    assert_one_line_error(code, err, "a.bin: 1,025 bytes is over --max-record-bytes (1,024)")


def test_folder_file_without_memory_to_read_it_is_one_line(capsys, tmp_path, monkeypatch):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.bin").write_bytes(b"a" * 100)

    class NoMemoryFile:
        def __init__(self, *args):
            self.fd = os.open(tmp_path / "images" / "a.bin", os.O_RDONLY)

        def fileno(self):
            return self.fd

        def read(self, size):
            raise MemoryError

        readinto = read

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            os.close(self.fd)

    monkeypatch.setattr(sources, "open", NoMemoryFile, raising=False)
    code, _, err = run(capsys, "convert", tmp_path / "images", tmp_path / "ds")
    assert_one_line_error(code, err, "a.bin: not enough memory to read its 100 bytes")
    assert not (tmp_path / "ds").exists()


def test_folder_file_name_that_is_not_utf8_is_one_line(capsys, tmp_path):
    (tmp_path / "images").mkdir()
    with open(os.path.join(os.fsencode(tmp_path / "images"), b"bad-\xff.jpg"), "wb") as file:
        file.write(b"jpeg")
    code, _, err = run(capsys, "convert", tmp_path / "images", tmp_path / "ds")
    assert_one_line_error(code, err, "bad-", "the file name is not valid UTF-8")


def test_max_record_bytes_does_not_apply_to_arrays(capsys, tmp_path):
    np.save(tmp_path / "rows.npy", np.zeros((2, 2)))
    code, _, err = run(capsys, "convert", tmp_path / "rows.npy", tmp_path / "ds", "--max-record-bytes", "1K")
    assert code == 2
    assert_one_line_error(code, err, "--max-record-bytes does not apply to npy sources")


def test_parquet_claiming_more_rows_than_its_bytes_is_refused(capsys, tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pyarrow.table({"nothing": pyarrow.nulls(1_000_000)}), tmp_path / "nulls.parquet")
    code, _, err = run(capsys, "convert", tmp_path / "nulls.parquet", tmp_path / "ds")
    assert_one_line_error(code, err, "nulls.parquet: its metadata claims 1,000,000 rows in a file of")
    assert not (tmp_path / "ds").exists()


def test_damaged_parquet_names_the_file(capsys, tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pyarrow.table({"text": [f"row {index}" * 20 for index in range(200)]}), tmp_path / "rows.parquet",
                        compression="none")
    data = bytearray((tmp_path / "rows.parquet").read_bytes())
    data[100:900] = bytes(800)  # the first data page, not the footer
    (tmp_path / "rows.parquet").write_bytes(bytes(data))
    code, _, err = run(capsys, "convert", tmp_path / "rows.parquet", tmp_path / "ds")
    assert_one_line_error(code, err, "rows.parquet")
    assert not (tmp_path / "ds").exists()


def test_failed_convert_removes_the_directories_it_created_but_not_others(capsys, tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"a": 1}\nnot json\n')
    code, _, err = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "new" / "deeper" / "ds")
    assert_one_line_error(code, err, "line 2: not valid JSON")
    assert not (tmp_path / "new").exists()
    (tmp_path / "existing").mkdir()
    code, _, _ = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "existing")
    assert code == 1 and (tmp_path / "existing").is_dir() and os.listdir(tmp_path / "existing") == []
