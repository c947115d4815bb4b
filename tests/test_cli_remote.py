"""The command line against object storage (issue 12): info, dump, stats, verify read URLs as they read paths;
convert and merge write to URLs; ``varstore cp`` copies between any two locations, verified on arrival, and a
failure leaves DST without a manifest. Talks to the session's moto S3 server on 127.0.0.1 (`s3_server`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME
from varstore.remote.filesystems import open_filesystem

from .helpers_cli import assert_one_line_error, run, run_json, run_json_lines, strict_json, write_dataset, write_shard

pytest.importorskip("s3fs")

RECORDS = [{"id": index, "text": "x" * (index * 37 % 500), "tokens": np.arange(index % 7, dtype=np.int32)} for index in range(40)]


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node cache (and the remote writer's staging) per test: nothing is served from another test's downloads."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def local_dataset(tmp_path: Path) -> Path:
    """Four shards of msgpack records."""
    return write_dataset(tmp_path / "local", RECORDS, codec="msgpack", max_shard_records=12, metadata={"source": "test"})


def _options(s3_server: Any) -> str:
    return json.dumps(s3_server.storage_options)


def _upload(local: Path, url: str, s3_server: Any) -> str:
    """Put every file of the local dataset `local` under `url` as it is (no varstore code in between)."""
    fs, root = open_filesystem(url, s3_server.storage_options)
    for path in sorted(local.iterdir()):
        if path.name.endswith((".data", ".index")) or path.name == MANIFEST_NAME:
            fs.put_file(str(path), f"{root}/{path.name}")
    return url


def _object_names(url: str, s3_server: Any) -> list[str]:
    fs, root = open_filesystem(url, s3_server.storage_options)
    fs.invalidate_cache()
    return sorted(path.rsplit("/", 1)[-1] for path in fs.find(root))


def _records(location: str | Path, s3_server: Any | None = None) -> list[Any]:
    options = {"storage_options": s3_server.storage_options} if s3_server is not None else {}
    with varstore.open(str(location), **options) as store:
        return store.get_batch(range(len(store)))


def _assert_records_equal(found: list[Any], expected: list[Any]) -> None:
    assert len(found) == len(expected)
    for got, want in zip(found, expected):
        assert got.keys() == want.keys()
        assert got["id"] == want["id"] and got["text"] == want["text"]
        np.testing.assert_array_equal(got["tokens"], want["tokens"])


def test_info_dump_stats_verify_of_an_s3_dataset_match_the_same_commands_on_the_local_copy(capsys, s3_server, local_dataset):
    url = _upload(local_dataset, f"s3://{s3_server.new_bucket()}/ds", s3_server)
    remote = ["--storage-options", _options(s3_server)]
    for command in (["info"], ["stats"], ["dump", "--range", "5:30"], ["dump", "-i", "-1", "--field", "text"]):
        code, local_out, _ = run(capsys, *command, local_dataset)
        assert code == 0
        code, remote_out, err = run(capsys, *command, url, *remote)
        assert (code, err) == (0, "")
        assert remote_out.replace(url, "PATH") == local_out.replace(str(local_dataset), "PATH")
    assert run_json(capsys, "info", url, *remote) == run_json(capsys, "info", local_dataset) | {"path": url}
    assert run_json(capsys, "stats", url, *remote) == run_json(capsys, "stats", local_dataset)
    assert run_json_lines(capsys, "dump", url, *remote) == run_json_lines(capsys, "dump", local_dataset)
    # a shard alone, at its prefix and at its index object
    assert run_json(capsys, "info", f"{url}/shard-000001.index", *remote) == run_json(
        capsys, "info", local_dataset / "shard-000001") | {"path": f"{url}/shard-000001"}

    timing = ("path", "seconds", "bytes_per_second")
    local_verify = {key: value for key, value in run_json(capsys, "verify", local_dataset).items() if key not in timing}
    remote_verify = {key: value for key, value in run_json(capsys, "verify", url, *remote).items() if key not in timing}
    assert remote_verify == local_verify and remote_verify["ok"] and remote_verify["checked_bytes"] > 0
    code, out, err = run(capsys, "verify", url, *remote)
    assert (code, err) == (0, "") and out.startswith("ok: 40 records in 4 shards; ")


def test_verify_on_s3_lists_every_damaged_shard_and_exits_1(capsys, s3_server, local_dataset):
    url = _upload(local_dataset, f"s3://{s3_server.new_bucket()}/ds", s3_server)
    fs, root = open_filesystem(url, s3_server.storage_options)
    for name in ("shard-000001.data", "shard-000003.data"):
        data = bytearray(fs.cat_file(f"{root}/{name}"))
        data[len(data) // 2] ^= 0x01  # same size: only the checksums can tell
        fs.pipe_file(f"{root}/{name}", bytes(data))
    report = run_json(capsys, "verify", url, "--storage-options", _options(s3_server), expected_code=1)
    assert [shard["ok"] for shard in report["shards"]] == [True, False, True, False]
    assert all("shard-00000" in shard["error"] for shard in report["shards"] if not shard["ok"])


def test_convert_and_merge_write_to_s3_and_read_back_equal(capsys, tmp_path, s3_server, local_dataset):
    bucket = s3_server.new_bucket()
    options = ["--storage-options", _options(s3_server)]
    lines = tmp_path / "lines.jsonl"
    lines.write_text("".join(json.dumps({"id": index, "text": f"line {index}"}) + "\n" for index in range(25)))
    code, out, err = run(capsys, "convert", lines, f"s3://{bucket}/converted", "--max-shard-records", "10", *options)
    assert (code, err) == (0, "") and f"to s3://{bucket}/converted" in out
    assert _records(f"s3://{bucket}/converted", s3_server) == [{"id": index, "text": f"line {index}"} for index in range(25)]

    lone = write_shard(tmp_path / "lone", RECORDS[:5], codec="msgpack", metadata={"source": "test"})
    code, out, err = run(capsys, "merge", local_dataset, lone, f"s3://{bucket}/merged", *options)
    assert (code, err) == (0, ""), err
    assert "10 files uploaded" in out
    _assert_records_equal(_records(f"s3://{bucket}/merged", s3_server), RECORDS + RECORDS[:5])
    # merge, like convert, refuses to write over a dataset
    code, out, err = run(capsys, "merge", local_dataset, f"s3://{bucket}/merged", *options)
    assert_one_line_error(code, err, "varstore merge: ", f"s3://{bucket}/merged", "already there")


def test_cp_round_trips_local_to_s3_to_another_bucket_to_local_verified(capsys, tmp_path, s3_server, local_dataset):
    first, second = f"s3://{s3_server.new_bucket()}/ds", f"s3://{s3_server.new_bucket()}/copy"
    options = ["--storage-options", _options(s3_server)]
    for source, destination in ((local_dataset, first), (first, second), (second, tmp_path / "back")):
        code, out, err = run(capsys, "cp", source, destination, *options)
        assert (code, err) == (0, ""), err
        assert out.startswith("copied 40 records in 4 shards (") and out.rstrip().endswith("verified on arrival")
    original = (local_dataset / MANIFEST_NAME).read_bytes()
    assert (tmp_path / "back" / MANIFEST_NAME).read_bytes() == original  # byte for byte: the same dataset version
    fs, root = open_filesystem(second, s3_server.storage_options)
    assert fs.cat_file(f"{root}/{MANIFEST_NAME}") == original
    _assert_records_equal(_records(tmp_path / "back"), RECORDS)
    # a shard alone, to a new prefix in the bucket and back
    code, _, err = run(capsys, "cp", local_dataset / "shard-000002", f"{first}-lone", *options)
    assert (code, err) == (0, ""), err
    code, _, err = run(capsys, "cp", f"{first}-lone", tmp_path / "lone", *options)
    assert (code, err) == (0, ""), err
    assert (tmp_path / "lone.data").read_bytes() == (local_dataset / "shard-000002.data").read_bytes()


def test_cp_refuses_an_existing_destination_without_overwrite(capsys, tmp_path, s3_server, local_dataset):
    url = f"s3://{s3_server.new_bucket()}/ds"
    options = ["--storage-options", _options(s3_server)]
    other = write_dataset(tmp_path / "other", [{"id": -1}], codec="msgpack")
    assert run(capsys, "cp", other, url, *options)[0] == 0
    before = _object_names(url, s3_server)
    code, _, err = run(capsys, "cp", local_dataset, url, *options)
    assert_one_line_error(code, err, "varstore cp: ", url, "already there", "--overwrite")
    assert _object_names(url, s3_server) == before
    code, _, err = run(capsys, "cp", url, other, *options)
    assert_one_line_error(code, err, "varstore cp: ", str(other), "already there", "--overwrite")

    code, _, err = run(capsys, "cp", local_dataset, url, "--overwrite", *options)
    assert (code, err) == (0, ""), err
    _assert_records_equal(_records(url, s3_server), RECORDS)
    assert len(_object_names(url, s3_server)) == 1 + 2 * 4  # the replaced dataset's objects are gone


def test_cp_from_a_damaged_source_fails_naming_it_and_leaves_no_manifest_at_the_destination(capsys, tmp_path, s3_server, local_dataset):
    source = _upload(local_dataset, f"s3://{s3_server.new_bucket()}/ds", s3_server)
    fs, root = open_filesystem(source, s3_server.storage_options)
    data = bytearray(fs.cat_file(f"{root}/shard-000002.data"))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(f"{root}/shard-000002.data", bytes(data))
    options = ["--storage-options", _options(s3_server)]

    destination = f"s3://{s3_server.new_bucket()}/copy"
    code, _, err = run(capsys, "cp", source, destination, *options)
    assert_one_line_error(code, err, "varstore cp: ", f"{source}/shard-000002", "damaged")
    assert _object_names(destination, s3_server) == []  # no manifest, and the shards copied before are deleted too

    code, _, err = run(capsys, "cp", source, tmp_path / "copy", *options)
    assert_one_line_error(code, err, "varstore cp: ", f"{source}/shard-000002", "damaged")
    assert not (tmp_path / "copy").exists()

    # an --overwrite that fails leaves no dataset either (never the old one with new shards, or a damaged one)
    assert run(capsys, "cp", local_dataset, tmp_path / "copy")[0] == 0
    code, _, err = run(capsys, "cp", source, tmp_path / "copy", "--overwrite", *options)
    assert code == 1
    assert not (tmp_path / "copy" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("command", [["info", "s3://bucket/ds"], ["verify", "s3://bucket/ds"], ["cp", "s3://bucket/a", "s3://bucket/b"],
                                     ["convert", "a.jsonl", "s3://bucket/b"], ["merge", "a", "s3://bucket/b"]])
@pytest.mark.parametrize("value", ['{"endpoint_url": ', "[1, 2]", '"key"'])
def test_storage_options_that_are_not_a_json_object_are_a_usage_error(capsys, command, value):
    code, out, err = run(capsys, *command, "--storage-options", value)
    assert code == 2 and out == ""
    assert_one_line_error(code, err, f"varstore {command[0]}: argument --storage-options: ")
    assert "not valid JSON" in err or "expected a JSON object" in err


def test_location_options_with_only_local_paths_are_a_usage_error(capsys, local_dataset, tmp_path):
    code, _, err = run(capsys, "info", local_dataset, "--storage-options", "{}")
    assert code == 2
    assert_one_line_error(code, err, "varstore info: ", "--storage-options applies to URLs")
    code, _, err = run(capsys, "cp", local_dataset, tmp_path / "copy", "--cache-dir", tmp_path)
    assert code == 2
    assert_one_line_error(code, err, "varstore cp: ", "--cache-dir applies to URLs")


def test_credentials_and_endpoint_from_the_environment_alone(tmp_path, s3_server, local_dataset):
    """No --storage-options: a fresh process reaches the server through AWS_ENDPOINT_URL and the AWS_* keys
    alone, which s3fs (through botocore) reads itself."""
    url = f"s3://{s3_server.new_bucket()}/ds"
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    environment.update(
        AWS_ENDPOINT_URL=s3_server.endpoint_url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    script = f"""
import sys
from varstore.cli import main
sys.exit(main(["cp", {str(local_dataset)!r}, {url!r}, "-q"]) or main(["info", {url!r}, "--json"]))
"""
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert strict_json(done.stdout.splitlines()[-1])["record_count"] == 40
    assert s3_server.requests(url.split("/")[2], method="PUT")  # it was this server that received the copy
