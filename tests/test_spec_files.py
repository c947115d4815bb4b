"""What the spec says of files as a caller names them: a shard opened by its path follows links and needs two
regular files (§1.3), and a manifest's byte spelling is not part of the format (§3). Both readers must agree."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import varstore
from varstore.format.notation import to_json

from . import spec_reader

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
DATASETS = VECTORS / "datasets"


def test_a_shard_opened_through_symbolic_links_is_read_by_both_readers(tmp_path):
    for suffix in (".index", ".data"):
        os.symlink(VECTORS / f"msgpack-samples{suffix}", tmp_path / f"linked{suffix}")
    expected = json.loads((VECTORS / "msgpack-samples.json").read_text(encoding="utf-8"))["records"]
    assert [spec_reader.notation(record) for record in spec_reader.read_shard(str(tmp_path / "linked"))["records"]] == expected
    with varstore.open(tmp_path / "linked") as reader:
        reader.verify()
        assert [to_json(record) for record in reader] == expected


@pytest.mark.parametrize("index_kind", ["missing", "directory"])
def test_a_shard_whose_index_is_not_a_regular_file_fails_step_1(tmp_path, index_kind):
    shutil.copyfile(VECTORS / "bytes-basic.data", tmp_path / "shard.data")
    if index_kind == "directory":
        (tmp_path / "shard.index").mkdir()
    with pytest.raises(spec_reader.SpecError) as refusal:
        spec_reader.open_shard(str(tmp_path / "shard"))
    assert refusal.value.rule == "§1.3 step 1"
    with pytest.raises(varstore.VarstoreError):
        varstore.open(tmp_path / "shard")


def _spec_read(directory: Path) -> str:
    """The dataset the spec-only reader reads, as JSON text in the notation: comparable, 1 apart from 1.0."""
    dataset = spec_reader.read_dataset(str(directory))
    for shard in dataset["shards"]:
        shard["records"] = [spec_reader.notation(record) for record in shard["records"]]
    return json.dumps(dataset, ensure_ascii=False)


SPELLINGS = {
    "compact": lambda document: json.dumps(document, ensure_ascii=False, separators=(",", ":")),
    "members-reversed": lambda document: json.dumps(dict(reversed(list(document.items()))), ensure_ascii=False, indent=3),
    "ascii-escapes": lambda document: json.dumps(document, ensure_ascii=True),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("name", sorted(path.stem for path in DATASETS.glob("*.json")))
def test_a_manifest_spelled_another_way_is_the_same_dataset_with_a_new_version(tmp_path, name, spelling):
    """The same "crc32c" passes over other bytes; only the version, a digest of the bytes, changes."""
    respelled = tmp_path / name
    shutil.copytree(DATASETS / name, respelled)
    document = json.loads((respelled / "manifest.json").read_bytes())
    text = SPELLINGS[spelling](document)
    assert text.encode() != (DATASETS / name / "manifest.json").read_bytes()
    (respelled / "manifest.json").write_text(text, encoding="utf-8")
    assert _spec_read(respelled) == _spec_read(DATASETS / name)
    with varstore.open(DATASETS / name) as original, varstore.open(respelled) as reader:
        reader.verify()
        assert (reader.metadata, [to_json(record) for record in reader]) == (original.metadata, [to_json(record) for record in original])
        assert reader.version != original.version
