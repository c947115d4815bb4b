"""The dataset vectors of spec/vectors/datasets/: the spec-only reader and varstore read each to its hand-written
description (NAME.json), and varstore's writer reproduces every byte of it (shards and manifest)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import varstore
from varstore.format.notation import to_json

from . import spec_reader

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ROOT / "spec" / "vectors" / "datasets"
NAMES = sorted(path.stem for path in DATASETS.glob("*.json"))


def _description(name: str) -> dict:
    return json.loads((DATASETS / f"{name}.json").read_text(encoding="utf-8"))


def test_dataset_vectors_hold_an_empty_shard_and_non_ascii_manifest_metadata():
    descriptions = [_description(name) for name in NAMES]
    assert any(not shard["records"] for description in descriptions for shard in description["shards"])
    assert any(not json.dumps(description["metadata"], ensure_ascii=False).isascii() for description in descriptions)
    manifests = [json.loads((DATASETS / name / "manifest.json").read_bytes()) for name in NAMES]
    assert all("crc32c" in manifest for manifest in manifests)


@pytest.mark.parametrize("name", NAMES)
def test_spec_only_reader_reads_dataset_vector_to_its_description(name):
    expected = _description(name)
    dataset = spec_reader.read_dataset(str(DATASETS / name))
    assert (dataset["codec"], dataset["codec_params"], dataset["metadata"]) == (
        expected["codec"], expected["codec_params"], expected["metadata"]
    )
    assert [shard["name"] for shard in dataset["shards"]] == [shard["name"] for shard in expected["shards"]]
    for got, want in zip(dataset["shards"], expected["shards"]):
        assert [spec_reader.notation(record) for record in got["records"]] == want["records"], got["name"]
    for shard in expected["shards"]:
        opened = spec_reader.open_shard(str(DATASETS / name / shard["name"]))
        assert opened.metadata["user"] == expected["shard_metadata"]
        assert bool(opened.header["flags"] & 1) == expected["record_checksums"]


@pytest.mark.parametrize("name", NAMES)
def test_library_reads_dataset_vector_to_its_description(name):
    expected = _description(name)
    with varstore.open(DATASETS / name) as reader:
        reader.verify()
        assert (reader.codec, reader.metadata) == (expected["codec"], expected["metadata"])
        assert [to_json(record) for record in reader] == [record for shard in expected["shards"] for record in shard["records"]]
        assert [len(shard["records"]) for shard in expected["shards"]] == [len(reader.shard(k)) for k in range(len(expected["shards"]))]


def _make_vectors_datasets():
    spec = importlib.util.spec_from_file_location("make_vectors_datasets", ROOT / "tools" / "make_vectors_datasets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NAMES)
def test_writer_reproduces_dataset_vector_byte_for_byte(name, tmp_path):
    _make_vectors_datasets().write_dataset(tmp_path, _description(name))
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted(path.name for path in (DATASETS / name).iterdir())
    for file_name in written:
        assert (tmp_path / file_name).read_bytes() == (DATASETS / name / file_name).read_bytes(), file_name
