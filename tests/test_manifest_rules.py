"""The manifest admits exactly one reading: the version is the integer 1, and no JSON member name repeats."""

from __future__ import annotations

import json

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME, decode_manifest

from .test_reader_metadata import traced_open


def manifest_text(tmp_path) -> str:
    with varstore.ShardedWriter(tmp_path, max_shard_records=1) as writer:
        writer.extend([b"a", b"b"])
    return (tmp_path / MANIFEST_NAME).read_text()


@pytest.mark.parametrize("version", ["true", "1.0", '"1"', "1e0"])
def test_manifest_version_must_be_the_integer_one(tmp_path, version):
    text = manifest_text(tmp_path).replace('"version": 1', f'"version": {version}')
    with pytest.raises(varstore.FormatError, match="version"):
        decode_manifest(text.encode(), path="m")


@pytest.mark.parametrize(
    ("before", "duplicate"),
    [
        ('"codec"', '"shards": [], '),
        ('"codec"', '"version": 1, '),
        ('"data_crc32c"', '"records": 0, '),
        ('"name": "bytes"', '"name": "str", '),
    ],
)
def test_manifest_with_a_duplicated_member_is_refused(tmp_path, before, duplicate):
    text = manifest_text(tmp_path)
    position = text.index(before)
    forged = text[:position] + duplicate + text[position:]
    json.loads(forged)  # Python's own parser would take the last one silently
    with pytest.raises(varstore.FormatError, match="appears twice"):
        decode_manifest(forged.encode(), path="m")
    (tmp_path / MANIFEST_NAME).write_text(forged)
    with pytest.raises(varstore.FormatError, match="appears twice"):
        varstore.open(tmp_path)


@pytest.mark.parametrize("member", ['"metadata": {"x": NaN}', '"metadata": {"x": Infinity}', '"metadata": {"x": "\\ud800"}'])
def test_manifest_json_that_is_not_strict_is_refused(tmp_path, member):
    text = manifest_text(tmp_path).replace('"metadata": {}', member)
    assert member in text
    with pytest.raises(varstore.FormatError, match="not valid UTF-8 JSON"):
        decode_manifest(text.encode(), path="m")


def test_manifest_metadata_nested_past_the_limit_is_refused_when_written_not_only_when_read(tmp_path):
    with varstore.Writer(tmp_path / "shard-a") as writer:
        writer.append(b"a")
    deep: dict = {}
    for _ in range(70):
        deep = {"x": deep}
    with pytest.raises(varstore.FormatError, match="nests"):
        varstore.write_manifest(tmp_path, metadata=deep)
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_dataset_version_is_a_blake2b_digest_of_the_manifest_bytes(tmp_path):
    import hashlib

    manifest_text(tmp_path)
    digest = hashlib.blake2b((tmp_path / MANIFEST_NAME).read_bytes(), digest_size=16).digest()
    with varstore.open(tmp_path) as dataset:
        assert dataset.version == int.from_bytes(digest, "little")


def test_open_dataset_holds_its_manifest_within_the_stated_bound(tmp_path):
    """spec §3: opening a manifest (parsing it, then spelling it canonically for its checksum) takes at most 56x
    its size, and the open dataset keeps no more than that."""
    with varstore.Writer(tmp_path / "shard-a") as writer:
        writer.append(b"a")
    # The costliest JSON per byte that §1.4's rule accepts: a map of short keys to small integers (chains of
    # empty arrays, which cost more, are refused beyond the allowance).
    varstore.write_manifest(tmp_path, metadata={"x": {f"{number:x}": 0 for number in range(60_000)}})
    compact = json.dumps(json.loads((tmp_path / MANIFEST_NAME).read_text()), separators=(",", ":"))
    (tmp_path / MANIFEST_NAME).write_text(compact)  # as a hostile writer would: no white space, most objects per byte
    size = len(compact)
    assert size > 400_000
    dataset, peak, held = traced_open(str(tmp_path))
    assert peak <= 56 * size + (1 << 20)
    assert held <= 56 * size + (1 << 20)
    assert len(dataset.metadata["x"]) == 60_000


def test_write_manifest_refuses_a_manifest_readers_would_refuse_and_keeps_the_good_one(tmp_path):
    """Regression (a24): write_manifest(d, ["a", "a"], overwrite=True) replaced a good manifest by an unreadable one."""
    with varstore.Writer(tmp_path / "a") as writer:
        writer.append(b"x")
    varstore.write_manifest(tmp_path)
    good = (tmp_path / MANIFEST_NAME).read_bytes()
    with pytest.raises(varstore.FormatError, match="listed twice"):
        varstore.write_manifest(tmp_path, ["a", "a"], overwrite=True)
    assert (tmp_path / MANIFEST_NAME).read_bytes() == good
    assert list(varstore.open(tmp_path)) == [b"x"]


@pytest.mark.parametrize("metadata", [{1: 2}, {"nested": [{2.5: "x"}]}])
def test_manifest_metadata_keys_that_json_would_turn_into_strings_are_refused(tmp_path, metadata):
    """Regression (a24): metadata={1: 2} was committed and read back as {"1": 2}."""
    with varstore.Writer(tmp_path / "a") as writer:
        writer.append(b"x")
    with pytest.raises(varstore.FormatError, match="keys must be strings"):
        varstore.write_manifest(tmp_path, metadata=metadata)
    with pytest.raises(varstore.FormatError, match="keys must be strings"):
        varstore.ShardedWriter(tmp_path / "sharded", metadata=metadata)
    assert not (tmp_path / MANIFEST_NAME).exists()
    assert not (tmp_path / "sharded").exists()
