"""``varstore convert --workers N`` and `varstore.conversion.convert(..., workers=N)`: the parts converted in worker
processes and committed in order give the records of ``--workers 1``, in the same order, for every source format."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import varstore
from tests.helpers_cli import assert_one_line_error, run
from varstore.conversion import convert


def plain(record: Any) -> Any:
    return record.tolist() if isinstance(record, np.ndarray) else record


def records_of(path: Any, **options: Any) -> list[Any]:
    return [plain(record) for record in varstore.open(path, **options)]


def write_jsonl(path: Path, count: int = 300) -> Path:
    with open(path, "w") as file:
        for index in range(count):
            file.write(json.dumps({"text": f"document {index} " + "w" * (index % 17), "id": index}) + "\n")
            if index % 50 == 7:
                file.write("\n")  # blank lines are left out, whichever part they fall in
    return path


def jsonl_source(tmp_path: Path) -> tuple[Path, list[str]]:
    return write_jsonl(tmp_path / "docs.jsonl"), ["--field", "text"]


def jsonl_samples_source(tmp_path: Path) -> tuple[Path, list[str]]:
    return write_jsonl(tmp_path / "docs.jsonl"), []


def text_source(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"".join(f"line {index}\r\n".encode() * (1 + index % 2) for index in range(200)) + b"last, no ending")
    return path, []


def tokens_source(tmp_path: Path) -> tuple[Path, list[str]]:
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 12, size=5000).astype(np.uint16)  # separator 9: adjacent separators too
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    return path, ["--dtype", "uint16", "--separator", "9"]


def tokens_dropped_source(tmp_path: Path) -> tuple[Path, list[str]]:
    path, options = tokens_source(tmp_path)
    return path, options + ["--drop-separator"]


def npy_source(tmp_path: Path) -> tuple[Path, list[str]]:
    np.save(tmp_path / "rows.npy", np.arange(300 * 4, dtype=np.float32).reshape(300, 4))
    return tmp_path / "rows.npy", []


def npy_offsets_source(tmp_path: Path) -> tuple[Path, list[str]]:
    np.save(tmp_path / "rows.npy", np.arange(300 * 2, dtype=np.int64).reshape(300, 2))
    np.save(tmp_path / "offsets.npy", np.array([0, 3, 3, 50, 51, 120, 200, 299, 300]))
    return tmp_path / "rows.npy", ["--offsets", tmp_path / "offsets.npy"]


def folder_source(tmp_path: Path) -> tuple[Path, list[str]]:
    for label in ("cat", "dog", "emu"):
        for index in range(7 if label != "dog" else 1):
            (tmp_path / "images" / label / f"sub{index % 2}").mkdir(parents=True, exist_ok=True)
            (tmp_path / "images" / label / f"sub{index % 2}" / f"{index}.jpg").write_bytes(f"{label} {index}".encode())
    return tmp_path / "images", ["--labels"]


def parquet_source(tmp_path: Path) -> tuple[Path, list[str]]:
    parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    rows = [{"text": None if index % 11 == 3 else f"row {index}", "n": index} for index in range(100)]
    parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "rows.parquet", row_group_size=9)
    return tmp_path / "rows.parquet", ["--field", "text", "--skip-null"]


SOURCES: dict[str, Callable[[Path], tuple[Path, list[str]]]] = {
    "jsonl field": jsonl_source,
    "jsonl samples": jsonl_samples_source,
    "text": text_source,
    "tokens": tokens_source,
    "tokens, separator dropped": tokens_dropped_source,
    "npy rows": npy_source,
    "npy offsets": npy_offsets_source,
    "folder with labels": folder_source,
    "parquet row groups": parquet_source,
}


@pytest.mark.parametrize("name", SOURCES)
def test_workers_write_the_records_of_one_worker_in_the_same_order(capsys: Any, tmp_path: Path, name: str) -> None:
    source, options = SOURCES[name](tmp_path)
    code, out, err = run(capsys, "convert", source, tmp_path / "serial", *options, "--max-shard-records", "40")
    assert code == 0, err
    code, out, err = run(capsys, "convert", source, tmp_path / "parallel", *options, "--max-shard-records", "40", "--workers", "3")
    assert code == 0, err
    serial, parallel = varstore.open(tmp_path / "serial"), varstore.open(tmp_path / "parallel")
    assert len(serial) > 0
    assert records_of(tmp_path / "parallel") == records_of(tmp_path / "serial")
    assert (parallel.manifest.codec, parallel.manifest.codec_params, parallel.manifest.metadata) == (
        serial.manifest.codec, serial.manifest.codec_params, serial.manifest.metadata)
    assert len({entry.name.split("-")[2] for entry in parallel.manifest.shards}) > 1  # more than one part wrote
    assert sorted(os.listdir(tmp_path / "parallel")) == sorted(
        ["manifest.json"] + [entry.name + suffix for entry in parallel.manifest.shards for suffix in (".data", ".index")])
    if name == "parquet row groups":
        assert "left out 9 samples whose text is null" in out
    parallel.verify()


def test_more_workers_than_records_and_an_empty_input(capsys: Any, tmp_path: Path) -> None:
    (tmp_path / "two.txt").write_text("a\nb\n")
    (tmp_path / "empty.txt").write_text("")
    for name in ("two", "empty"):
        code, _, err = run(capsys, "convert", tmp_path / f"{name}.txt", tmp_path / name, "--workers", "4")
        assert code == 0, err
    assert records_of(tmp_path / "two") == ["a", "b"]
    assert records_of(tmp_path / "empty") == []


def test_workers_to_s3_equal_one_worker_locally(capsys: Any, tmp_path: Path, s3_server: Any) -> None:
    source, options = jsonl_source(tmp_path)
    url = f"s3://{s3_server.new_bucket()}/docs"
    storage = ["--storage-options", json.dumps(s3_server.storage_options)]
    code, _, err = run(capsys, "convert", source, tmp_path / "serial", *options)
    assert code == 0, err
    code, out, err = run(capsys, "convert", source, url, *options, "--workers", "2", "--max-shard-records", "100", *storage)
    assert code == 0, err
    assert records_of(url, storage_options=s3_server.storage_options) == records_of(tmp_path / "serial")
    code, _, err = run(capsys, "convert", source, url, *options, "--workers", "2", *storage)
    assert_one_line_error(code, err, "pass --overwrite")
    text, _ = text_source(tmp_path)
    code, _, err = run(capsys, "convert", text, tmp_path / "text")
    assert code == 0, err
    code, _, err = run(capsys, "convert", text, url, "--workers", "2", "--overwrite", *storage)
    assert code == 0, err
    assert records_of(url, storage_options=s3_server.storage_options) == records_of(tmp_path / "text")


def test_a_failing_worker_fails_convert_with_its_error_and_leaves_nothing(capsys: Any, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl")
    lines = source.read_text().splitlines(keepends=True)
    broken = len(lines) - 5  # in the last part: its line number is counted across the parts before it
    lines[broken] = "{not json\n"
    source.write_text("".join(lines))
    code, _, err = run(capsys, "convert", source, tmp_path / "dataset", "--field", "text", "--workers", "3", "--max-shard-records", "8")
    assert_one_line_error(code, err, f"docs.jsonl, line {broken + 1}: not valid JSON")
    assert not (tmp_path / "dataset").exists()  # convert created it, and removed it again


def test_the_python_function_equals_the_command(capsys: Any, tmp_path: Path) -> None:
    source, _ = folder_source(tmp_path)
    code, _, err = run(capsys, "convert", source, tmp_path / "serial", "--labels")
    assert code == 0, err
    assert convert(source, tmp_path / "parallel", workers=2, labels=True, max_shard_records=5) == 15
    assert records_of(tmp_path / "parallel") == records_of(tmp_path / "serial")
    assert varstore.open(tmp_path / "parallel").manifest.metadata == {"labels": ["cat", "dog", "emu"]}
    with pytest.raises(varstore.VarstoreError, match="does not apply"):
        convert(source, tmp_path / "other", workers=2, field="text")
    with pytest.raises(varstore.ShardExistsError):
        convert(source, tmp_path / "parallel", workers=2, labels=True)


def test_a_killed_driver_leaves_no_manifest(tmp_path: Path) -> None:
    source = tmp_path / "big.txt"
    source.write_bytes(b"".join(b"line %d\n" % index for index in range(120_000)))
    destination = tmp_path / "dataset"
    driver = subprocess.Popen(
        [sys.executable, "-m", "varstore", "convert", source, destination, "--workers", "2", "--max-shard-records", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(name.endswith(".index") for name in _names(destination)):  # a worker published a shard
            assert driver.poll() is None and time.monotonic() < deadline, "no part shard appeared while the driver ran"
            time.sleep(0.005)
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(timeout=30) == -signal.SIGKILL
        # The orphaned workers end their parts (each removes its staging folder) and then find no driver.
        while any(name.endswith("staging") for name in _names(destination)):
            assert time.monotonic() < deadline, "the workers did not end"
            time.sleep(0.01)
    finally:
        driver.kill()
        driver.wait(timeout=30)
    assert "manifest.json" not in _names(destination)
    with pytest.raises(varstore.MissingFileError):
        varstore.open(destination)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
