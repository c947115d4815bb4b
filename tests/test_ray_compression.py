"""varstore.ray with compression: `VarstoreDatasink(compression=, compression_level=)` reaches every shard a write
task writes, and a compression it cannot write is refused on the driver. Ray is the node tests/test_ray.py starts
for the session when it ran first, else one started here for this file."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install -e '.[ray]'")
pytest.importorskip("ray.data")
pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore
from varstore.errors import VarstoreError
from varstore.format.manifest import MANIFEST_NAME
from varstore.ray import VarstoreDatasink

from .test_ray import RAY_START_ATTEMPTS, preserving_order, start_ray

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
    pytest.mark.timeout(RAY_START_ATTEMPTS * 150 + 300),
]

WORDS = ["ray", "task", "block", "shard", "frame", "record", "level", "window", "sample", "dictionary"]
TEXTS = [" ".join(WORDS[(k * 3 + j) % len(WORDS)] for j in range(5 + k % 13)) + f" {k}" for k in range(600)]


@pytest.fixture(scope="module")
def ray_node(s3_server: Any) -> Iterator[Any]:
    """The running Ray node (tests/test_ray.py's session node stays up until the session ends), else one started
    here and shut down after this file: never a second node beside the first."""
    if ray.is_initialized():
        yield s3_server
        return
    start_ray()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        yield s3_server
    finally:
        ray.shutdown()


def shard_headers(dataset: Path) -> list[tuple[int, int, dict]]:
    """Each listed shard's (minor version, compression byte, metadata "compression" member), read from its index."""
    found = []
    for entry in json.loads((dataset / MANIFEST_NAME).read_text(encoding="utf-8"))["shards"]:
        index = (dataset / f"{entry['name']}.index").read_bytes()
        metadata_size = struct.unpack_from("<Q", index, 32)[0]
        found.append((struct.unpack_from("<H", index, 10)[0], index[13], json.loads(index[64 : 64 + metadata_size]).get("compression")))
    return found


def test_every_shard_of_every_write_task_is_compressed_at_the_level_given(ray_node: Any, tmp_path: Path) -> None:
    ds = ray.data.from_items([{"text": text} for text in TEXTS], override_num_blocks=4)
    with preserving_order():
        ds.write_datasink(VarstoreDatasink(tmp_path / "ray", codec="str", column="text", max_shard_records=100,
                                           max_shard_bytes=8_000, compression="zstd", compression_level=7))
    headers = shard_headers(tmp_path / "ray")
    assert len(headers) >= 6
    assert headers == [(0, 1, {"name": "zstd", "level": 7})] * len(headers)
    with varstore.open(tmp_path / "ray") as dataset:
        dataset.verify()
        assert list(dataset) == TEXTS


def test_auto_keeps_incompressible_records_raw_in_every_shard(ray_node: Any, tmp_path: Path) -> None:
    generator = random.Random(5)
    blobs = [generator.randbytes(generator.randrange(200, 2000)) for _ in range(300)]
    ds = ray.data.from_items([{"data": blob} for blob in blobs], override_num_blocks=3)
    with preserving_order():
        ds.write_datasink(VarstoreDatasink(tmp_path / "ray", codec="bytes", column="data", max_shard_bytes=60_000,
                                           compression="auto"))
    headers = shard_headers(tmp_path / "ray")
    assert len(headers) >= 3
    assert [(minor, compression, member["name"]) for minor, compression, member in headers] == [(2, 0, "none")] * len(headers)
    assert all("sample_ratios" in member["auto"] for _, _, member in headers)
    assert list(varstore.open(tmp_path / "ray")) == blobs


@pytest.mark.parametrize(("options", "message"), [
    ({"compression": "brotli"}, "compression must be None, 'zstd', 'zstd-dict', 'zstd-blocks', 'zstd-dict-blocks' or 'auto', not 'brotli'"),
    ({"compression": "zstd", "compression_level": 0}, "compression_level must be an integer from 1 to 19, not 0"),
])
def test_a_compression_the_writers_cannot_write_is_refused_on_the_driver(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(VarstoreError, match=message):
        VarstoreDatasink(tmp_path / "ray", column="data", **options)
