"""`ShardedWriter(url, storage_options=...)` (varstore/dataset/remote_target.py): shards uploaded as they commit, the
manifest last; kills, faults, resume from the object store and overwrite, against moto on loopback (s3) or
fsspec's in-process memory filesystem (memory://)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import varstore
from varstore.errors import (
    ConcurrentWriterError,
    DatasetReplacedError,
    MissingFileError,
    ShardExistsError,
    StorageError,
)
from varstore.remote.filesystems import open_filesystem
from tests.helpers_fault_proxy import FaultProxy, fault_proxy  # noqa: F401 - fault_proxy is a fixture

pytest.importorskip("fsspec")

RECORDS = [f"record {number}" for number in range(10)]
SHARD_RECORDS = 3  # 10 records: shards of 3, 3, 3 and 1
DEADLINE_SECONDS = 30.0

# The child writes RECORDS to argv[1] and is killed while one of its uploads is held by the proxy.
WRITER_CHILD = """
import json, sys, varstore
url, options = sys.argv[1], json.loads(sys.argv[2])
with varstore.ShardedWriter(url, "str", max_shard_records=%d, storage_options=options) as writer:
    writer.extend(json.loads(sys.argv[3]))
""" % SHARD_RECORDS


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Staging directories and the readers' cache under the test's own directory, never the user's."""
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def memory_url() -> str:
    return f"memory://remote-writer-{secrets.token_hex(6)}/dataset"


def object_names(url: str, options: dict[str, Any] | None = None) -> list[str]:
    fs, root = open_filesystem(url, options)
    fs.invalidate_cache()
    try:
        return sorted(os.path.basename(path) for path in fs.ls(root, detail=False)) if fs.exists(root) else []
    finally:
        fs.invalidate_cache()  # the listing must not answer later lookups (the instance is shared)


def stored_records(url: str, options: dict[str, Any] | None, cache: Path) -> list[Any]:
    with varstore.open(url, storage_options=options, cache_dir=str(cache)) as reader:
        return list(reader)


def shard_objects(names: list[str]) -> list[str]:
    return [f"{name}{suffix}" for name in names for suffix in (".data", ".index")]


def write(url: str, records: list[Any], options: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
    with varstore.ShardedWriter(url, "str", max_shard_records=SHARD_RECORDS, storage_options=options, **kwargs) as writer:
        writer.extend(records)
    return writer.shard_names


@pytest.mark.parametrize(
    "codec, options, records",
    [
        ("bytes", {}, [b"", b"a", bytes(range(256)), b"\x00" * 1000, b"z"]),
        ("str", {}, ["", "h\u00e9llo", "\u65e5\u672c", "x" * 500, "last"]),
        ("ndarray", {"dtype": "float32", "shape": (2,)}, [np.arange(2 * n, dtype=np.float32).reshape(n, 2) for n in range(5)]),
        ("msgpack", {}, [{"a": 1, "b": [1, 2.5, None]}, [], {"tokens": np.arange(4, dtype=np.int64)}, "s", {"nested": {"x": b"y"}}]),
    ],
)
def test_every_codec_round_trips_through_s3(
    s3_server: Any, node_cache: Path, codec: str, options: dict[str, Any], records: list[Any]
) -> None:
    url = f"s3://{s3_server.new_bucket()}/data/set"
    with varstore.ShardedWriter(url, codec, max_shard_records=2, storage_options=s3_server.storage_options, **options) as writer:
        writer.extend(records)
    assert len(writer.shard_names) == 3
    read = stored_records(url, s3_server.storage_options, node_cache)
    assert len(read) == len(records)
    for got, expected in zip(read, records):
        if codec == "ndarray":
            np.testing.assert_array_equal(got, expected)
        elif codec == "msgpack" and isinstance(expected, dict) and "tokens" in expected:
            np.testing.assert_array_equal(got["tokens"], expected["tokens"])
        else:
            assert got == expected


def test_manifest_is_the_last_object_written_after_the_journal_and_each_shards_data_then_index(
    s3_server: Any, node_cache: Path
) -> None:
    bucket = s3_server.new_bucket()
    names = write(f"s3://{bucket}/ds", RECORDS, s3_server.storage_options)
    journal = "ds/.varstore-journal"
    expected = [journal]  # once per run, a few hundred bytes: the shards are found by listing
    for name in names:
        expected += [f"ds/{name}.data", f"ds/{name}.index"]
    expected.append("ds/manifest.json")
    puts = [request.key for request in s3_server.requests(bucket, method="PUT") if request.key]  # not the bucket's
    assert puts == expected
    # The run ends by deleting its journal, after the manifest: readers see only the dataset.
    assert [request.key for request in s3_server.requests(bucket, method="DELETE")] == [journal]
    assert object_names(f"s3://{bucket}/ds", s3_server.storage_options) == sorted(["manifest.json"] + shard_objects(names))
    assert stored_records(f"s3://{bucket}/ds", s3_server.storage_options, node_cache) == RECORDS


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("held, resume_from", [(".data", "the same machine"), (".index", "another machine")])
def test_writer_killed_during_an_upload_leaves_no_manifest_and_resume_completes_it(
    s3_server: Any, fault_proxy: Callable[[str], FaultProxy], tmp_path: Path, node_cache: Path, held: str, resume_from: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    through_proxy = {**s3_server.storage_options, "endpoint_url": proxy.url}
    held_path = f"/{bucket}/ds/shard-000001{held}"
    proxy.delay(DEADLINE_SECONDS * 4, method="PUT", path=held_path)
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER_CHILD, url, json.dumps(through_proxy), json.dumps(RECORDS)],
        env={**os.environ, "VARSTORE_CACHE_DIR": str(node_cache)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: child.poll() is not None or any(r.delayed and r.path == held_path for r in proxy.requests()),
            "the held upload",
        )
        assert child.poll() is None, child.communicate(timeout=10)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    proxy.clear_rules()
    assert "manifest.json" not in object_names(url, s3_server.storage_options)
    assert "shard-000000.index" in object_names(url, s3_server.storage_options)

    if resume_from == "the same machine":  # the killed writer's staging directory (its lock, journal, files) is there
        options = through_proxy
    else:  # a node that never saw the staging directory, talking to the store directly
        options = s3_server.storage_options
        monkeypatch.setenv("VARSTORE_CACHE_DIR", str(tmp_path / "other-node"))
    with varstore.ShardedWriter(url, "str", max_shard_records=SHARD_RECORDS, storage_options=options, resume=True) as writer:
        assert len(writer) == SHARD_RECORDS  # shard-000000 adopted; the cut-short shard-000001 discarded
        writer.extend(RECORDS[len(writer):])
    assert stored_records(url, s3_server.storage_options, tmp_path / "reader-cache") == RECORDS
    # Nothing left over: the discarded shard's objects and the journal are gone.
    assert object_names(url, s3_server.storage_options) == sorted(["manifest.json"] + shard_objects(writer.shard_names))


def test_transient_upload_faults_are_retried(s3_server: Any, fault_proxy: Callable[[str], FaultProxy], node_cache: Path) -> None:
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    data, index = f"/{bucket}/ds/shard-000001.data", f"/{bucket}/ds/shard-000001.index"
    proxy.server_error(times=1, method="PUT", path=data)
    proxy.reset(times=1, method="PUT", path=index)
    proxy.slow_down(times=1, method="PUT", path=f"/{bucket}/ds/manifest.json")
    write(f"s3://{bucket}/ds", RECORDS, options)
    assert (proxy.count("PUT", data), proxy.count("PUT", index), proxy.count("PUT", f"/{bucket}/ds/manifest.json")) == (2, 2, 2)
    assert stored_records(f"s3://{bucket}/ds", s3_server.storage_options, node_cache) == RECORDS


def test_persistent_upload_fault_fails_naming_the_url_leaves_no_manifest_and_resume_completes(
    s3_server: Any, fault_proxy: Callable[[str], FaultProxy], node_cache: Path
) -> None:
    proxy = fault_proxy(s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    options = {**s3_server.storage_options, "endpoint_url": proxy.url}
    proxy.server_error(times=None, method="PUT", path=f"/{bucket}/ds/shard-000001.data")
    writer = varstore.ShardedWriter(url, "str", max_shard_records=SHARD_RECORDS, storage_options=options)
    with pytest.raises(StorageError) as failure:
        writer.extend(RECORDS)
    message = str(failure.value)
    assert message.startswith(url) and "resume=True" in message and "3 records are safely committed" in message
    assert f"{url}/shard-000001.data" in message  # the object that failed
    with pytest.raises(varstore.VarstoreError, match="refused"):
        writer.close()
    assert "manifest.json" not in object_names(url, s3_server.storage_options)

    proxy.clear_rules()
    with varstore.ShardedWriter(url, "str", max_shard_records=SHARD_RECORDS, storage_options=options, resume=True) as writer:
        assert len(writer) == SHARD_RECORDS
        writer.extend(RECORDS[len(writer):])
    assert stored_records(url, s3_server.storage_options, node_cache) == RECORDS


def test_overwrite_keeps_the_old_version_readable_until_the_new_manifest_then_deletes_its_objects(
    s3_server: Any, node_cache: Path
) -> None:
    url = f"s3://{s3_server.new_bucket()}/ds"
    options = s3_server.storage_options
    old_records = [f"old {number}" for number in range(5)]
    old_names = write(url, old_records, options)
    old_reader = varstore.open(url, storage_options=options, cache_dir=str(node_cache))
    new_records = [f"new {number}" for number in range(8)]
    writer = varstore.ShardedWriter(url, "str", max_shard_records=SHARD_RECORDS, storage_options=options, overwrite=True)
    writer.extend(new_records)  # two new shards uploaded, a third in progress
    assert len(writer.shard_names) == 2 and not set(writer.shard_names) & set(old_names)
    assert list(old_reader) == old_records
    assert stored_records(url, options, node_cache) == old_records  # a reader opening now still gets the old version
    assert set(shard_objects(old_names)) <= set(object_names(url, options))

    writer.close()
    assert stored_records(url, options, node_cache) == new_records
    assert object_names(url, options) == sorted(["manifest.json"] + shard_objects(writer.shard_names))
    for position in range(len(old_records)):  # the old reader: its own records or an error, never new ones
        try:
            assert old_reader[position] == old_records[position]
        except (DatasetReplacedError, MissingFileError):
            pass
    old_reader.close()


def test_abort_removes_every_object_the_run_uploaded(memory_url: str) -> None:
    with pytest.raises(RuntimeError):
        with varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS) as writer:
            writer.extend(RECORDS)
            assert len(writer.shard_names) == 3
            raise RuntimeError("stop")
    assert object_names(memory_url) == []


def test_resume_after_abort_keeps_the_adopted_shards(memory_url: str, node_cache: Path) -> None:
    writer = varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS)
    writer.extend(RECORDS[:7])
    del writer  # dropped, as a crash would: the journal object and two uploaded shards stay
    with pytest.raises(RuntimeError):
        with varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS, resume=True) as writer:
            assert len(writer) == 6
            writer.extend(RECORDS[6:])
            raise RuntimeError("stop")
    with varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS, resume=True) as writer:
        assert len(writer) == 6
        writer.extend(RECORDS[6:])
    assert stored_records(memory_url, None, node_cache) == RECORDS


def test_second_writer_of_a_url_on_this_machine_is_refused(memory_url: str) -> None:
    first = varstore.ShardedWriter(memory_url, "str")
    try:
        with pytest.raises(ConcurrentWriterError, match=memory_url):
            varstore.ShardedWriter(memory_url, "str")
    finally:
        first.abort()


def test_new_run_refuses_an_existing_dataset_or_an_interrupted_run(memory_url: str) -> None:
    write(memory_url, RECORDS[:2])
    with pytest.raises(ShardExistsError, match="overwrite=True"):
        varstore.ShardedWriter(memory_url, "str")
    other = memory_url + "-interrupted"
    writer = varstore.ShardedWriter(other, "str", max_shard_records=SHARD_RECORDS)
    writer.extend(RECORDS)
    del writer
    with pytest.raises(ShardExistsError, match="resume=True"):
        varstore.ShardedWriter(other, "str")
    names = write(other, RECORDS[:1], overwrite=True)  # starting again removes the interrupted run's objects
    assert object_names(other) == sorted(["manifest.json"] + shard_objects(names))


def test_a_dataset_committed_meanwhile_is_not_replaced(memory_url: str) -> None:
    writer = varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS)
    writer.extend(RECORDS)
    fs, root = open_filesystem(memory_url)
    fs.pipe_file(f"{root}/manifest.json", b"another writer's manifest")
    with pytest.raises(ShardExistsError, match=f"{memory_url}/manifest.json"):
        writer.close()
    assert fs.cat_file(f"{root}/manifest.json") == b"another writer's manifest"


def test_local_path_refuses_storage_options(tmp_path: Path) -> None:
    with pytest.raises(varstore.VarstoreError, match="storage_options"):
        varstore.ShardedWriter(tmp_path / "ds", storage_options={"key": "x"})


def test_resume_refuses_a_run_whose_earlier_shard_lost_an_object(memory_url: str) -> None:
    writer = varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS)
    writer.extend(RECORDS[:7])  # shard-000000 and shard-000001 uploaded
    del writer
    fs, root = open_filesystem(memory_url)
    fs.rm_file(f"{root}/shard-000000.index")
    with pytest.raises(varstore.FormatError, match=f"^{memory_url}: cannot resume: shard shard-000000"):
        varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS, resume=True)


def test_resume_refuses_another_codec(memory_url: str) -> None:
    writer = varstore.ShardedWriter(memory_url, "str", max_shard_records=SHARD_RECORDS)
    writer.extend(RECORDS[:4])
    del writer
    with pytest.raises(varstore.RecordTypeError, match="codec"):
        varstore.ShardedWriter(memory_url, "bytes", resume=True)
