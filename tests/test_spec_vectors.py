"""The golden vectors against the spec: an independent reader, the library, and the writer byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import varstore
from varstore.record_json import from_json, to_json

from . import spec_reader

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
NAMES = sorted(path.stem for path in VECTORS.glob("*.json"))
CODEC_IDS = {"bytes": 0, "str": 1, "ndarray": 2, "msgpack": 3}


def _description(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))


def _spelled(record) -> object:
    """A record in the vectors' JSON spelling, computed here without varstore for the spec reader."""
    if isinstance(record, bytes):
        return {"$bytes": record.hex()}
    if isinstance(record, np.ndarray):
        return {"$array": {"dtype": record.dtype.str, "shape": list(record.shape), "values": record.reshape(-1).tolist()}}
    if isinstance(record, dict):
        return {key: _spelled(value) for key, value in record.items()}
    if isinstance(record, list):
        return [_spelled(value) for value in record]
    return record


def test_there_are_vectors_for_every_codec():
    assert {_description(name)["codec"] for name in NAMES} == set(CODEC_IDS)


def test_crc32c_check_value_matches_the_spec():
    assert spec_reader.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("name", NAMES)
def test_spec_only_reader_reads_vector(name):
    expected = _description(name)
    shard = spec_reader.read_shard(str(VECTORS / name))
    assert shard["codec"] == CODEC_IDS[expected["codec"]]
    for field in ("codec_params", "metadata", "record_checksums", "format_version", "record_count", "data_size", "data_crc32c"):
        assert shard[field] == expected[field], field
    assert [_spelled(record) for record in shard["records"]] == expected["records"]


@pytest.mark.parametrize("name", NAMES)
def test_library_reads_vector(name):
    expected = _description(name)
    with varstore.open(VECTORS / name) as reader:
        reader.verify()
        assert reader.codec == expected["codec"]
        assert reader.metadata == expected["metadata"]
        assert len(reader) == expected["record_count"]
        assert [to_json(record) for record in reader] == expected["records"]


@pytest.mark.parametrize("name", NAMES)
def test_writer_reproduces_vector_byte_for_byte(name, tmp_path):
    expected = _description(name)
    params = expected["codec_params"]
    with varstore.Writer(
        tmp_path / name,
        codec=expected["codec"],
        dtype=params.get("dtype"),
        shape=params.get("shape"),
        metadata=expected["metadata"],
        checksums=expected["record_checksums"],
    ) as writer:
        writer.extend(from_json(record) for record in expected["records"])
    for suffix in (".index", ".data"):
        assert (tmp_path / f"{name}{suffix}").read_bytes() == (VECTORS / f"{name}{suffix}").read_bytes(), suffix
