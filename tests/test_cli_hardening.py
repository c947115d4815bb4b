"""Issue 23's hardening of the command line and of what opens a store: a ``file://`` URL is the local path it names
everywhere; ``verify --json`` prints one JSON document whatever fails; ``dump --limit N`` shows at most N; ``info``
and ``dump`` of a dataset with a damaged shard show what they can and name the damage; a missing bucket or refused
credentials are said so by ``varstore.open``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import varstore
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture
from varstore.conversion import convert
from varstore.errors import ConcurrentWriterError, MissingFileError, StorageError
from varstore.format.manifest import MANIFEST_NAME
from varstore.local.file_url import resolve_file_url
from varstore.remote.filesystems import open_filesystem

from .helpers_cli import run, strict_json, write_dataset, write_shard

RECORD_BYTES = 3000


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """Four shards of five 3000-byte records each; record i is filled with byte i."""
    return write_dataset(tmp_path / "ds", [bytes([index]) * RECORD_BYTES for index in range(20)], max_shard_records=5)


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size)


# -- file:// is the local path it names --------------------------------------------------------------------------


@pytest.mark.parametrize("url, path", [
    ("file:///data/ds", "/data/ds"),
    ("file://ds/train", "ds/train"),  # as fsspec reads it: relative to the current directory
    ("FILE:///data/ds", "/data/ds"),
    ("local:///data/ds", "/data/ds"),
    ("s3://bucket/ds", "s3://bucket/ds"),
    ("memory://ds", "memory://ds"),
    ("data/file://ds", "data/file://ds"),
    ("/data/ds", "/data/ds"),
])
def test_a_file_url_resolves_to_the_path_it_names_and_nothing_else_changes(url: str, path: str) -> None:
    assert resolve_file_url(url) == path


def test_a_file_url_writer_holds_the_local_directory_lock(tmp_path: Path) -> None:
    """Through fsspec the writer of a file:// URL staged elsewhere and locked nothing at the URL, so a second writer
    of the same directory was let in, and the manifests of the two overwrote each other in place."""
    directory = tmp_path / "ds"
    directory.mkdir()
    with varstore.ShardedWriter(f"file://{directory}") as writer:
        writer.append(b"first")
        with pytest.raises(ConcurrentWriterError):
            varstore.ShardedWriter(directory)
    with varstore.ShardedWriter(directory, overwrite=True), pytest.raises(ConcurrentWriterError):
        varstore.ShardedWriter(f"file://{directory}", overwrite=True)


def test_file_urls_write_and_read_the_files_at_their_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a file:// URL taken for a relative path would write under ./file:
    with varstore.Writer(f"file://{tmp_path}/one") as writer:
        writer.extend([b"a", b"bc"])
    deep = tmp_path / "new" / "dir" / "ds"  # the parents are created, as for a local path
    with varstore.ShardedWriter(f"file://{deep}", max_shard_records=1) as writer:
        writer.extend([b"x", b"yz"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new", "one.data", "one.index"]  # no ./file:
    assert sorted(path.name for path in deep.iterdir()) == [MANIFEST_NAME, "shard-000000.data", "shard-000000.index",
                                                              "shard-000001.data", "shard-000001.index"]
    assert varstore.Reader(f"file://{tmp_path}/one")[1] == b"bc"
    assert varstore.ShardedReader(f"file://{deep}")[1] == b"yz"
    with varstore.open(f"file://{deep}/{MANIFEST_NAME}") as reader:
        assert isinstance(reader, varstore.ShardedReader) and not reader.is_remote and reader.path == str(deep)
    assert varstore.verify(f"file://{deep}").ok and varstore.describe(f"file://{deep}").record_count == 2
    assert varstore.repair(f"file://{deep}").kept_records == 2
    with varstore.Writer(f"file://{tmp_path}/loose/a") as writer:
        writer.append(b"loose")
    assert varstore.write_manifest(f"file://{tmp_path}/loose") == ["a"]
    assert varstore.open(tmp_path / "loose")[:] == [b"loose"]


def test_the_commands_take_file_urls_as_local_paths(capsys: Any, tmp_path: Path) -> None:
    source = tmp_path / "lines.txt"
    source.write_text("one\ntwo\nthree\n")
    assert run(capsys, "convert", f"file://{source}", f"file://{tmp_path}/converted")[0] == 0
    assert run(capsys, "cp", f"file://{tmp_path}/converted", f"file://{tmp_path}/copied")[0] == 0
    merged = ["merge", f"file://{tmp_path}/converted", f"file://{tmp_path}/copied", f"file://{tmp_path}/merged"]
    assert run(capsys, *merged)[0] == 0
    code, out, err = run(capsys, "verify", f"file://{tmp_path}/merged", "--json")
    assert code == 0 and strict_json(out)["records"] == 6, err
    assert strict_json(out)["path"] == str(tmp_path / "merged") and strict_json(out)["writer_running"] is False
    code, out, err = run(capsys, "info", f"file://{tmp_path}/merged/{MANIFEST_NAME}", "--json")
    assert code == 0 and strict_json(out)["path"] == str(tmp_path / "merged"), err
    assert varstore.open(tmp_path / "merged")[:] == ["one", "two", "three"] * 2
    assert convert(f"file://{source}", f"file://{tmp_path}/library") == 3 and (tmp_path / "library" / MANIFEST_NAME).exists()
    code, _, err = run(capsys, "info", f"file://{tmp_path}/merged", "--storage-options", "{}")
    assert code == 2 and "is a local path" in err


# -- verify --json: always one document ---------------------------------------------------------------------------


def _damaged_manifest(dataset: Path) -> Path:
    (dataset / MANIFEST_NAME).write_text("{not json")
    return dataset


def _truncated_shard(dataset: Path) -> Path:
    _truncate(dataset / "shard-000000.data", 10)
    return dataset / "shard-000000"


@pytest.mark.parametrize("damage, said", [
    (lambda dataset: dataset / "nothing-here", "no varstore shard or dataset here"),
    (_truncated_shard, "data file is 10 bytes"),
    (_damaged_manifest, "not valid UTF-8 JSON"),
])
def test_verify_json_prints_one_document_with_the_error_whatever_fails(
    capsys: Any, dataset: Path, damage: Callable[[Path], Path], said: str
) -> None:
    """A store that could not be opened printed nothing on stdout, so a pipeline into a JSON parser failed."""
    path = damage(dataset)
    text_code, text_out, text_err = run(capsys, "verify", path)
    code, out, err = run(capsys, "verify", path, "--json")
    assert (code, err) == (text_code, text_err) == (1, text_err) and text_out == ""
    assert said in err
    report = strict_json(out)
    assert report == {"path": str(path), "ok": False, "error": err.strip().removeprefix("varstore verify: ")}


def test_verify_json_of_an_intact_store_says_it_has_no_error(capsys: Any, dataset: Path) -> None:
    code, out, _ = run(capsys, "verify", dataset, "--json")
    assert code == 0 and strict_json(out)["error"] is None and strict_json(out)["ok"] is True


# -- dump --limit N shows at most N ---------------------------------------------------------------------------------

TOKENS = 1000


def _shown_values(out: str) -> list[int]:
    """The integers between the first '[' and its ']' in a record's text (the heading is the first line)."""
    body = out.split("\n", 1)[1]
    return [int(value) for value in body[body.index("[") + 1 : body.index("]")].split()]


@pytest.mark.parametrize("limit", [1, 2, 100, 300])
def test_dump_limit_shows_at_most_that_many_elements_of_a_token_record(capsys: Any, tmp_path: Path, limit: int) -> None:
    """Whatever N was, numpy's summary showed the first and last three elements: six of them."""
    shard = write_shard(tmp_path / "tokens", [np.arange(TOKENS, dtype=np.uint16)], codec="ndarray", dtype="uint16")
    code, out, _ = run(capsys, "dump", shard, "-i", "0", "--limit", limit)
    assert code == 0
    assert _shown_values(out) == list(range(limit))
    assert out.rstrip().endswith(f"... ({TOKENS - limit} more elements)")


def test_dump_limit_shows_whole_rows_of_a_two_dimensional_record(capsys: Any, tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "rows", [np.arange(30, dtype=np.int32).reshape(10, 3)], codec="ndarray",
                        dtype="int32", shape=(3,))
    code, out, _ = run(capsys, "dump", shard, "--limit", "7")
    assert code == 0
    assert out.splitlines()[1:] == ["[[0 1 2]", " [3 4 5]] ... (24 more elements)"]


@pytest.mark.parametrize("limit", [1, 2, 100, 300])
def test_dump_limit_caps_bytes_text_and_msgpack_containers(capsys: Any, tmp_path: Path, limit: int) -> None:
    payload = bytes(range(256)) * 4
    blobs = write_shard(tmp_path / "blobs", [payload])
    hex_rows = run(capsys, "dump", blobs, "--limit", limit)[1].splitlines()[1:]
    shown = "".join(row.split(": ", 1)[1][:39].replace(" ", "") for row in hex_rows if row[:8].isalnum())
    assert bytes.fromhex(shown) == payload[:limit]
    text = write_shard(tmp_path / "text", ["é" * TOKENS], codec="str")
    assert run(capsys, "dump", text, "--limit", limit)[1].splitlines()[1] == (
        json.dumps("é" * limit, ensure_ascii=False) + f"... ({TOKENS - limit:,} more characters)")
    samples = write_shard(tmp_path / "samples", [{"ids": list(range(TOKENS))}], codec="msgpack")
    out = run(capsys, "dump", samples, "--limit", limit)[1]
    items = re.search(r'"ids": \[(.*?)\]', out, re.DOTALL).group(1)
    *values, rest = [item.strip() for item in items.split(",")]
    assert [int(value) for value in values] == list(range(limit))
    assert rest == f"... ({TOKENS - limit} more items)"
    whole = strict_json(run(capsys, "dump", samples, "--json", "--limit", limit)[1])["record"]
    assert whole == {"ids": list(range(TOKENS))}


def test_dump_json_and_limit_zero_print_records_whole(capsys: Any, tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "tokens", [np.arange(TOKENS, dtype=np.uint16)], codec="ndarray", dtype="uint16")
    assert _shown_values(run(capsys, "dump", shard, "--limit", "0")[1]) == list(range(TOKENS))
    record = strict_json(run(capsys, "dump", shard, "--json", "--limit", "1")[1])["record"]
    assert record["$array"]["values"] == list(range(TOKENS))


# -- info and dump of a dataset with a damaged shard -----------------------------------------------------------------


def test_info_describes_a_dataset_with_a_truncated_shard_and_names_it(capsys: Any, dataset: Path) -> None:
    """It failed outright ("shard file is 14000 bytes, the manifest says 15000"): nothing said what the dataset was."""
    _truncate(dataset / "shard-000001.data", 14_000)
    reason = f"{dataset}/shard-000001.data: shard file is 14000 bytes, the manifest says {5 * RECORD_BYTES}"
    code, out, err = run(capsys, "info", dataset)
    assert code == 1
    fields = dict(line.split(None, 1) for line in out.split("\nshards\n")[0].splitlines())
    assert fields["records"] == "20"
    assert fields["damaged"].startswith("1 of 4 shards (shard-000001); varstore verify checks every record")
    heading = "damaged shards (records, payload and index as the manifest lists them)"
    assert out.rstrip().endswith(f"{heading}\n  shard-000001: {reason}")
    table = out.split("\nshards\n")[1].split("\ndamaged shards")[0].splitlines()
    assert [line.split()[-1] for line in table[1:]] == ["yes", "DAMAGED", "yes", "yes"]
    assert err == f"varstore info: {dataset}: damaged: 1 of 4 shards (shard-000001); varstore verify checks every " \
                  "record, varstore repair --write drops damaged shards from the manifest\n"
    code, out, _ = run(capsys, "info", dataset, "--json")
    facts = strict_json(out)
    assert code == 1 and facts["damaged_shards"] == ["shard-000001"] and facts["record_count"] == 20
    assert [shard["damage"] for shard in facts["shards"]] == [None, reason, None, None]
    assert facts["format_version"] == [1, 1] and facts["record_checksums"] is True  # from the intact shards
    assert [shard.name for shard in varstore.describe(dataset).damaged_shards] == ["shard-000001"]
    with pytest.raises(varstore.FormatError, match="the manifest says"):
        varstore.open(dataset)  # the reader's default stays strict


def test_info_names_a_shard_whose_index_is_missing(capsys: Any, dataset: Path) -> None:
    (dataset / "shard-000003.index").unlink()
    code, out, _ = run(capsys, "info", dataset, "--json")
    facts = strict_json(out)
    assert code == 1 and facts["damaged_shards"] == ["shard-000003"]
    assert "shard file listed in the manifest is missing" in facts["shards"][3]["damage"]


def test_dump_reads_an_intact_shard_of_a_damaged_dataset_and_names_the_damage_of_the_other(capsys: Any,
                                                                                         dataset: Path) -> None:
    _truncate(dataset / "shard-000001.data", 14_000)
    code, out, err = run(capsys, "dump", dataset, "-i", "12", "--json")
    assert (code, err) == (0, "")
    assert strict_json(out)["record"] == {"$bytes": bytes([12]).hex() * RECORD_BYTES}
    code, out, err = run(capsys, "dump", dataset, "-i", "6")
    assert code == 1 and out == ""
    assert "shard-000001" in err and "shard file is 14000 bytes, the manifest says 15000" in err


@pytest.mark.usefixtures("node_cache")
def test_info_at_a_url_names_a_shard_whose_index_object_is_missing(capsys: Any, s3_server: Any, dataset: Path) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    varstore.copy(dataset, url, storage_options=s3_server.storage_options)
    fs, root = open_filesystem(url, s3_server.storage_options)
    fs.rm_file(f"{root}/shard-000002.index")
    code, out, err = run(capsys, "info", url, "--json", "--storage-options", json.dumps(s3_server.storage_options))
    facts = strict_json(out)
    assert code == 1 and facts["damaged_shards"] == ["shard-000002"] and facts["record_count"] == 20, err
    assert f"{url}/shard-000002.index" in facts["shards"][2]["damage"]
    assert [shard["format_version"] for shard in facts["shards"]] == [[1, 1], [1, 1], None, [1, 1]]


# -- a missing bucket, refused credentials: varstore.open says so -------------------------------------------------


@pytest.mark.usefixtures("node_cache")
def test_open_of_a_missing_bucket_says_the_bucket_does_not_exist(s3_server: Any) -> None:
    """open looked with fs.exists, which answers False for a missing bucket: "no varstore shard or dataset here"."""
    bucket = f"{s3_server.new_bucket()}-missing"
    with pytest.raises(StorageError, match=f"the bucket '{bucket}' does not exist; create it first") as raised:
        varstore.open(f"s3://{bucket}/ds", storage_options=s3_server.storage_options)
    assert not isinstance(raised.value, MissingFileError)


@pytest.mark.usefixtures("node_cache")
def test_open_with_refused_credentials_says_so_in_one_request(s3_server: Any,
                                                             fault_proxy: Callable[[str], FaultProxy]) -> None:
    proxy = fault_proxy(s3_server.endpoint_url)
    proxy.error(403, "InvalidAccessKeyId", "refused by the fault proxy", times=None)
    url = f"s3://{s3_server.new_bucket()}/ds"
    with pytest.raises(StorageError, match=r"the store refused the credentials \(InvalidAccessKeyId"):
        varstore.open(url, storage_options={**s3_server.storage_options, "endpoint_url": proxy.url})
    assert proxy.count() == 1  # not retried


@pytest.mark.usefixtures("node_cache")
def test_open_of_an_empty_prefix_in_a_bucket_is_still_no_store_here(s3_server: Any) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    with pytest.raises(MissingFileError, match="no varstore shard or dataset here"):
        varstore.open(url, storage_options=s3_server.storage_options)


@pytest.mark.usefixtures("node_cache")
def test_verify_json_of_a_missing_bucket_prints_the_error(capsys: Any, s3_server: Any) -> None:
    bucket = f"{s3_server.new_bucket()}-missing"
    options = json.dumps(s3_server.storage_options)
    code, out, err = run(capsys, "verify", f"s3://{bucket}/ds", "--json", "--storage-options", options)
    assert code == 1 and f"the bucket '{bucket}' does not exist" in err
    assert strict_json(out)["error"] == err.strip().removeprefix("varstore verify: ")
