"""varstore.spark with compression: `write_dataframe(compression=, compression_level=)` reaches every shard each
partition's task writes, locally and on the loopback S3 server, and a compression the writers cannot write is
refused before any job runs. Spark is tests/test_spark.py's session (`getOrCreate` hands back the running one)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark]'")
pytest.importorskip("zstandard", reason="compressed shards need the zstd extra: pip install -e '.[zstd]'")

import varstore
from varstore.errors import VarstoreError
from varstore.remote.filesystems import open_filesystem
from varstore.spark import write_dataframe

from .test_spark import spark  # noqa: F401  (the session's SparkSession fixture, used by every test here)

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("spark")]

WORDS = ["spark", "partition", "task", "shard", "frame", "record", "level", "dictionary", "sample", "window"]
TEXTS = [" ".join(WORDS[(k * 7 + j) % len(WORDS)] for j in range(6 + k % 12)) + f" {k}" for k in range(900)]
PARTITIONS = 3


def text_frame() -> Any:
    """A DataFrame of (id, text) rows in id order, cut into PARTITIONS contiguous partitions, in the session's Spark."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    return session.createDataFrame(session.sparkContext.parallelize(list(enumerate(TEXTS)), PARTITIONS), "id long, text string")


def header_facts(index: bytes) -> tuple[int, int, int, dict]:
    """(major version, compression byte, dictionary size, metadata "compression" member) of an index file's bytes."""
    metadata_size = struct.unpack_from("<Q", index, 32)[0]
    return (struct.unpack_from("<H", index, 8)[0], index[13], struct.unpack_from("<I", index, 52)[0],
            json.loads(index[64 : 64 + metadata_size])["compression"])


def dictionary_of(index: bytes) -> bytes:
    """The dictionary section of a 2.0 index (§1.6): after the metadata, padded to 8, of the header's size."""
    start = -(-(64 + struct.unpack_from("<Q", index, 32)[0]) // 8) * 8
    return index[start : start + struct.unpack_from("<I", index, 52)[0]]


def test_each_partitions_shards_train_dictionaries_of_their_own(tmp_path: Path) -> None:
    names = write_dataframe(text_frame(), tmp_path / "spark", column="text", codec="str", max_shard_records=150,
                            compression="zstd-dict", compression_level=2)
    assert len(names) == 6 and len({name.split("-")[2] for name in names}) == PARTITIONS
    facts = [header_facts((tmp_path / "spark" / f"{name}.index").read_bytes()) for name in names]
    assert [(major, compression, member) for major, compression, _, member in facts] == [(2, 2, {"name": "zstd-dict", "level": 5})] * 6
    dictionaries = [dictionary_of((tmp_path / "spark" / f"{name}.index").read_bytes()) for name in names]
    assert all(dictionary[:4] == b"\x37\xa4\x30\xec" for dictionary in dictionaries)  # zstd's dictionary magic
    assert len(set(dictionaries)) == 6
    with varstore.open(tmp_path / "spark") as dataset:
        dataset.verify()
        assert list(dataset) == TEXTS


def test_an_s3_destination_gets_compressed_shards(s3_server: Any) -> None:
    url = f"s3://{s3_server.new_bucket()}/texts"
    names = write_dataframe(text_frame(), url, column="text", codec="str", max_shard_records=300,
                            compression="zstd", storage_options=s3_server.storage_options)
    fs, root = open_filesystem(url, s3_server.storage_options)
    facts = [header_facts(fs.cat_file(f"{root}/{name}.index")) for name in names]
    assert [(major, compression, member) for major, compression, _, member in facts] == [(2, 1, {"name": "zstd", "level": 3})] * len(names)
    with varstore.open(url, storage_options=s3_server.storage_options) as dataset:
        dataset.verify()
        assert list(dataset) == TEXTS


def test_a_compression_the_writers_cannot_write_is_refused_before_any_job(tmp_path: Path) -> None:
    with pytest.raises(VarstoreError, match="compression_level must be an integer from 1 to 19, not 22"):
        write_dataframe(text_frame(), tmp_path / "spark", column="text", codec="str", compression="zstd",
                        compression_level=22)
    assert not (tmp_path / "spark").exists()
