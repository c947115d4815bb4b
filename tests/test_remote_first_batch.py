"""What a DataLoader worker does before its first sample, and what it no longer repeats after its parent did it: a
forked worker reopens the parent's remote dataset from the parent's reader (its pinned version from the node cache:
no request for the manifest), and every S3 filesystem varstore opens shares one aiobotocore session, which keeps
the service descriptions a client is made of (a forked worker's client costs a few ms, not a second)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import varstore
from varstore.remote import filesystems
from varstore.remote.filesystems import open_filesystem

pytest.importorskip("s3fs")
torch = pytest.importorskip("torch")

from varstore.torch import RecordDataset

JOIN_SECONDS = 120


@pytest.fixture(autouse=True)
def node_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "node-cache"
    monkeypatch.setenv("VARSTORE_CACHE_DIR", str(cache))
    return cache


def uploaded_dataset(s3_server: Any, tmp_path: Path, records: list[bytes]) -> str:
    local_dir = tmp_path / "local"
    with varstore.ShardedWriter(local_dir, "bytes", max_shard_records=10) as writer:
        writer.extend(records)
    url = f"s3://{s3_server.new_bucket()}/ds"
    fs, path = open_filesystem(url, s3_server.storage_options)
    for name in sorted(os.listdir(local_dir)):
        fs.put_file(str(local_dir / name), f"{path}/{name}")
    return url


def as_list(batch: list[bytes]) -> list[bytes]:
    return batch


def test_forked_workers_reopen_the_parents_dataset_without_asking_for_its_manifest(s3_server: Any, tmp_path: Path) -> None:
    records = [bytes([n]) * (100 + n) for n in range(40)]
    url = uploaded_dataset(s3_server, tmp_path, records)
    bucket = url.split("/")[2]
    dataset = RecordDataset(url, storage_options=s3_server.storage_options)
    assert len(dataset) == 40  # the parent opens it: two requests, the manifest kept in the node cache
    before = len(s3_server.requests(bucket))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", collate_fn=as_list, timeout=JOIN_SECONDS
    )
    assert [bytes(record.numpy()) for batch in loader for record in batch] == records
    during = s3_server.requests(bucket)[before:]
    assert [request.key for request in during if request.key.endswith("manifest.json")] == []
    assert {request.key.rsplit(".", 1)[-1] for request in during} == {"index", "data"}


def test_every_s3_filesystem_shares_one_session_and_a_forked_child_inherits_it(s3_server: Any) -> None:
    first, _ = open_filesystem("s3://bucket-a/x", s3_server.storage_options)
    second, _ = open_filesystem("s3://bucket-b/y", {**s3_server.storage_options, "config_kwargs": {"connect_timeout": 9}})
    assert first is not second and first.session is second.session is filesystems._shared_session()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a new filesystem (fsspec makes one per process), the parent's session
        try:
            again, _ = open_filesystem("s3://bucket-a/x", s3_server.storage_options)
            os.write(write, b"same" if again is not first and again.session is first.session else b"other")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 16) == b"same"
    finally:
        os.close(read)
        os.waitpid(child, 0)


def test_a_caller_who_names_a_profile_gets_s3fs_its_own_session(s3_server: Any) -> None:
    fs, _ = open_filesystem("s3://bucket-a/x", {**s3_server.storage_options, "profile": "someone"})
    assert fs.session is None  # s3fs makes it, with the profile, at its first request
