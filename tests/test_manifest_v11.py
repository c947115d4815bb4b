"""Manifest rules of format 1.1 (spec §3, §3.1): the "crc32c" member, exact members, no symbolic link, plain
names, and every listed shard checked against its entry at open."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from crc32c import crc32c

import varstore
from varstore.format import header as fmt
from varstore.format.manifest import MANIFEST_NAME


def spec_crc32c(document: dict[str, Any]) -> int:
    """The manifest checksum as §3 states it, spelled here from the spec rather than by the library:
    CRC32C of the canonical JSON (sorted members, no white space, raw UTF-8) of the object without "crc32c"."""
    members = {name: value for name, value in document.items() if name != "crc32c"}
    return crc32c(json.dumps(members, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def write_dataset(directory: Path, shards: list[list[bytes]], **metadata: Any) -> Path:
    """A dataset of one shard per list in `shards` (empty lists give 0-record shards), named shard-000000, ..."""
    directory.mkdir()
    names = [f"shard-{number:06d}" for number in range(len(shards))]
    for name, records in zip(names, shards):
        with varstore.Writer(directory / name) as writer:
            writer.extend(records)
    varstore.write_manifest(directory, names, metadata=metadata)
    return directory


def forge_manifest(directory: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Change the manifest's parsed object and write it back with a correct "crc32c", so only the rule under test can
    catch the change."""
    path = directory / MANIFEST_NAME
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document)
    document["crc32c"] = spec_crc32c(document)
    path.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")


# -- "crc32c" -------------------------------------------------------------------------------------


def test_written_manifest_carries_the_crc32c_of_its_canonical_json(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a"], []], tokenizer="gpt2 é \u2028", scale=0.1, vocab=50257)
    document = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    assert document["crc32c"] == spec_crc32c(document)
    assert (directory / MANIFEST_NAME).read_text(encoding="utf-8").startswith('{\n "codec"'), "still indented for people"


@pytest.mark.parametrize("original, flipped", [(b'"gpt2"', b'"gpt3"'), (b"50257", b"50247"), (b"0.1", b"0.3")])
def test_flip_inside_manifest_metadata_is_refused_at_open(tmp_path, original, flipped):
    """Regression (issue 10, point 10): nothing else checks "metadata", so two such flips passed full verification."""
    directory = write_dataset(tmp_path / "d", [[b"a"]], tokenizer="gpt2", vocab=50257, scale=0.1)
    path = directory / MANIFEST_NAME
    raw = path.read_bytes()
    assert raw.count(original) == 1
    path.write_bytes(raw.replace(original, flipped))
    with pytest.raises(varstore.FormatError, match=r"manifest\.json: manifest checksum is 0x[0-9a-f]{8} .* expected 0x"):
        varstore.open(directory)


def test_manifest_of_a_1_0_writer_without_crc32c_opens_unchecked(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a", b"b"], [b"c"]], tokenizer="gpt2")
    path = directory / MANIFEST_NAME
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith(' "crc32c": ')), encoding="utf-8")
    assert "crc32c\"" not in path.read_text(encoding="utf-8").replace("_crc32c\"", "")
    with varstore.open(directory) as dataset:
        assert list(dataset) == [b"a", b"b", b"c"] and dataset.metadata == {"tokenizer": "gpt2"}


@pytest.mark.parametrize("value", [-1, 2**32, 1.5, 1e3, "12345", True, None, [1]])
def test_manifest_crc32c_that_is_not_a_32_bit_integer_is_refused(tmp_path, value):
    directory = write_dataset(tmp_path / "d", [[b"a"]])
    path = directory / MANIFEST_NAME
    document = json.loads(path.read_text(encoding="utf-8"))
    document["crc32c"] = value
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(varstore.FormatError, match=r'manifest\.json: manifest "crc32c" must be an integer in \[0, 4294967296\)'):
        varstore.open(directory)


# -- exact members ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where, change",
    [
        ("the manifest", lambda document: document.update(comment="hello")),
        ('the manifest\'s "codec"', lambda document: document["codec"].update(comment="hello")),
        ("shard entry 1", lambda document: document["shards"][1].update(comment="hello")),
    ],
)
def test_unknown_manifest_member_is_refused_naming_it(tmp_path, where, change):
    directory = write_dataset(tmp_path / "d", [[b"a"], [b"b"]])
    forge_manifest(directory, change)
    with pytest.raises(varstore.FormatError, match=f"manifest.json: {where} has the unknown member 'comment'"):
        varstore.open(directory)


@pytest.mark.parametrize(
    "where, member, change",
    [
        ("the manifest", "metadata", lambda document: document.pop("metadata")),
        ('the manifest\'s "codec"', "params", lambda document: document["codec"].pop("params")),
        ("shard entry 0", "data_crc32c", lambda document: document["shards"][0].pop("data_crc32c")),
    ],
)
def test_missing_manifest_member_is_refused_naming_it(tmp_path, where, member, change):
    directory = write_dataset(tmp_path / "d", [[b"a"]])
    forge_manifest(directory, change)
    with pytest.raises(varstore.FormatError, match=f"manifest.json: {where} lacks the member '{member}'"):
        varstore.open(directory)


def test_bytes_codec_with_ndarray_params_in_the_manifest_is_refused_at_open(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"ab"]])
    forge_manifest(directory, lambda document: document["codec"].update(params={"dtype": "<u2", "shape": []}))
    with pytest.raises(varstore.FormatError, match="manifest.json: bytes codec parameters have the unknown member 'dtype'"):
        varstore.open(directory)


# -- no symbolic link ------------------------------------------------------------------------------


def test_symlinked_manifest_is_refused_even_when_its_target_is_valid(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a"]])
    os.replace(directory / MANIFEST_NAME, tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", directory / MANIFEST_NAME)
    with pytest.raises(varstore.FormatError, match="manifest.json: manifest is a symbolic link; it must be a regular file"):
        varstore.open(directory)


def test_writer_over_a_symlinked_manifest_replaces_the_link_and_leaves_its_target(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a"]])
    target = tmp_path / "elsewhere.json"
    os.replace(directory / MANIFEST_NAME, target)
    kept = target.read_bytes()
    os.symlink(target, directory / MANIFEST_NAME)
    with pytest.raises(varstore.ShardExistsError, match="manifest is a symbolic link"):
        varstore.ShardedWriter(directory)
    with varstore.ShardedWriter(directory, overwrite=True) as writer:
        writer.append(b"new")
    assert not (directory / MANIFEST_NAME).is_symlink() and target.read_bytes() == kept
    with varstore.open(directory) as dataset:
        assert list(dataset) == [b"new"]


# -- names -----------------------------------------------------------------------------------------


def test_name_with_two_dots_inside_is_a_plain_name(tmp_path):
    """§3.1: the regex is the rule; "a..b" is neither ".." nor a path."""
    with varstore.Writer(tmp_path / "a..b") as writer:
        writer.append(b"x")
    varstore.write_manifest(tmp_path, ["a..b"])
    with varstore.open(tmp_path) as dataset:
        assert list(dataset) == [b"x"]


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b"])
def test_dot_dotdot_hidden_and_slashed_names_are_refused(tmp_path, name):
    directory = write_dataset(tmp_path / "d", [[b"a"]])
    forge_manifest(directory, lambda document: document["shards"][0].update(name=name))
    with pytest.raises(varstore.FormatError, match="names must be plain file names"):
        varstore.open(directory)


# -- every listed shard checked at open ------------------------------------------------------------


def test_records_flipped_from_1_to_0_is_refused_at_open_naming_the_shard(tmp_path):
    """Regression (issue 10, point 11): a shard listed with 0 records was never opened, so this flip dropped a record."""
    directory = write_dataset(tmp_path / "d", [[b"a"], [b"b"], [b"c"]])
    forge_manifest(directory, lambda document: document["shards"][1].update(records=0))
    with pytest.raises(
        varstore.FormatError,
        match="shard-000001.index: shard does not match the manifest: its record count is 1, the manifest says 0",
    ):
        varstore.open(directory)


def test_records_flipped_from_2_to_1_in_a_middle_shard_is_refused_at_open(tmp_path):
    """Regression (issue 10, point 11). Shards [a, b], [c, d], [e, f] with the middle entry's "records" 2 -> 1:
    a 1.0 reader opened it with len 5, and dataset[3] returned e (shard 2's first record) instead of d; every later
    global index shifted by one, silently, unless a record of the middle shard happened to be read."""
    directory = write_dataset(tmp_path / "d", [[b"a", b"b"], [b"c", b"d"], [b"e", b"f"]])
    forge_manifest(directory, lambda document: document["shards"][1].update(records=1))
    with pytest.raises(
        varstore.FormatError,
        match="shard-000001.index: shard does not match the manifest: its record count is 2, the manifest says 1",
    ):
        varstore.open(directory)


def forge_header(index_path: Path, **fields: int) -> None:
    """Rewrite an index header with `fields` changed and a correct header checksum."""
    raw = bytearray(index_path.read_bytes())
    header = fmt.unpack_header(bytes(raw[: fmt.HEADER_SIZE]), index_size=len(raw), path=str(index_path))
    raw[: fmt.HEADER_SIZE] = dataclasses.replace(header, **fields).pack()
    index_path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "forgery, message",
    [
        (lambda path: forge_header(path, data_crc32c=12345), "its data checksum is 12345, the manifest says 0"),
        (lambda path: forge_header(path, codec_id=3), "its codec id is 3, the manifest says 0"),
        (lambda path: forge_header(path, body_crc32c=1), "its index checksum is"),
        (lambda path: path.write_bytes(b"\x00" + path.read_bytes()[1:]), "not a varstore index: magic is"),
        (lambda path: path.write_bytes(path.read_bytes()[:20] + b"\x01" + path.read_bytes()[21:]), "header checksum"),
    ],
)
def test_zero_record_shard_with_a_forged_index_header_is_refused_at_open(tmp_path, forgery, message):
    """A 0-record shard holds no record to read, so only the open can notice that its header is not the one listed."""
    directory = write_dataset(tmp_path / "d", [[b"a"], [], [b"b"]])
    forgery(directory / "shard-000001.index")
    with pytest.raises(varstore.FormatError, match=f"shard-000001.index: .*{message}"):
        varstore.open(directory)


def test_data_file_of_a_zero_record_shard_grown_is_refused_at_open(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a"], []])
    (directory / "shard-000001.data").write_bytes(b"x")
    with pytest.raises(varstore.FormatError, match="shard-000001.data: shard file is 1 bytes, the manifest says 0"):
        varstore.open(directory)


def test_symlinked_index_file_is_refused_at_open(tmp_path):
    directory = write_dataset(tmp_path / "d", [[b"a"], []])
    os.replace(directory / "shard-000001.index", tmp_path / "elsewhere.index")
    os.symlink(tmp_path / "elsewhere.index", directory / "shard-000001.index")
    with pytest.raises(varstore.FormatError, match="shard-000001.index: shard files must be regular files"):
        varstore.open(directory)


@pytest.mark.parametrize("suffix", [".data", ".index"])
def test_write_manifest_refuses_a_symlinked_shard_file_naming_it(tmp_path, suffix):
    """Regression (issue 10 attack): describe_shard followed the link and listed the shard, so write_manifest committed
    a dataset every reader refuses at open (§3.1: shard files are regular files; §3: a writer checks by the reader's rules)."""
    directory = tmp_path / "d"
    directory.mkdir()
    with varstore.Writer(directory / "a") as writer:
        writer.append(b"hello")
    os.replace(directory / f"a{suffix}", tmp_path / f"a{suffix}")
    os.symlink(tmp_path / f"a{suffix}", directory / f"a{suffix}")
    with pytest.raises(varstore.FormatError, match=f"a\\{suffix}: shard files must be regular files"):
        varstore.write_manifest(directory)
    assert not (directory / MANIFEST_NAME).exists()


# -- names equal ignoring ASCII case -----------------------------------------------------------------


def test_shard_names_equal_ignoring_case_are_refused_at_open(tmp_path):
    """§3.1: on a case-insensitive filesystem "shard-000000" and "SHARD-000000" are one pair of files."""
    directory = write_dataset(tmp_path / "d", [[b"a"], [b"b"]])
    forge_manifest(directory, lambda document: document["shards"][1].update(name="SHARD-000000"))
    with pytest.raises(varstore.FormatError, match="'shard-000000' and 'SHARD-000000' differ only in case"):
        varstore.open(directory)


def test_write_manifest_refuses_shard_names_equal_ignoring_case(tmp_path):
    directory = tmp_path / "d"
    directory.mkdir()
    for name in ("part", "Part"):
        with varstore.Writer(directory / name) as writer:
            writer.append(name.encode())
    with pytest.raises(varstore.FormatError, match="differ only in case"):
        varstore.write_manifest(directory, ["part", "Part"])
    assert not (directory / MANIFEST_NAME).exists()
