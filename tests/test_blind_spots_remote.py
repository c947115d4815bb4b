"""The object-storage code's refusals that no other test pinned: the mutants of issue 23 that passed its tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import varstore
from tests.test_remote_reader import upload, write_local
from varstore.dataset import remote_source
from varstore.errors import FormatError, VarstoreError
from varstore.format.checksum import crc32c
from varstore.remote.cache import NodeCache


def write_bytes(data: bytes) -> Callable[[str], None]:
    """A download that writes `data`."""
    def download(temporary: str) -> None:
        Path(temporary).write_bytes(data)
    return download


@pytest.mark.parametrize("limit", [-1, -(1 << 40)])
def test_a_negative_cache_limit_is_refused_naming_it_and_creates_nothing(tmp_path: Path, limit: int) -> None:
    with pytest.raises(VarstoreError, match=f"the cache limit must be at least 0 bytes, not {limit}"):
        NodeCache(str(tmp_path / "cache"), limit_bytes=limit)
    assert not (tmp_path / "cache").exists()


def test_a_cache_limit_of_zero_keeps_only_the_object_last_fetched(tmp_path: Path) -> None:
    cache = NodeCache(str(tmp_path / "cache"), limit_bytes=0)
    first, second = b"first object", b"the second object"
    first_path = cache.fetch("bucket/first", len(first), crc32c(first), write_bytes(first))
    assert Path(first_path).read_bytes() == first
    second_path = cache.fetch("bucket/second", len(second), crc32c(second), write_bytes(second))
    assert Path(second_path).read_bytes() == second
    assert not os.path.exists(first_path)


@pytest.mark.usefixtures("node_cache")
def test_a_remote_manifest_exactly_at_the_size_limit_opens_and_one_byte_over_is_refused(
        s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    local = write_local(tmp_path / "local", ["one", "two", "three"], shard_records=2)
    size = (local / "manifest.json").stat().st_size
    url = upload(s3_server, local, f"s3://{s3_server.new_bucket()}/ds")
    monkeypatch.setattr(remote_source, "MAX_MANIFEST_SIZE", size)  # the limit, scaled down to this manifest
    assert list(varstore.open(url, storage_options=s3_server.storage_options)) == ["one", "two", "three"]
    monkeypatch.setattr(remote_source, "MAX_MANIFEST_SIZE", size - 1)
    with pytest.raises(FormatError, match=f"manifest is over the limit of {size - 1} bytes"):
        varstore.open(url, storage_options=s3_server.storage_options)
