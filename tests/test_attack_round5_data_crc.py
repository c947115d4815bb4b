"""Round 5 attacks on format 1.3's "data CRC32C not recorded" (spec/FORMAT.md §1.2, §1.3 step 7, §7.2): forged
members, a merge into object storage, a shard put into object storage by other means, and spec_reader against
varstore on changed metadata bytes of the new vector."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.cli import main
from varstore.conversion.megatron import SHARD_NAME, import_megatron
from varstore.dataset.writer import write_manifest
from varstore.errors import FormatError, UsageError, VarstoreError

from . import spec_reader, spec_reader_1_1
from .test_megatron_layout import write_megatron

VECTOR = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "ndarray-data-crc-unrecorded"
VECTOR_DATA = VECTOR.with_suffix(".data").read_bytes()


def _forged_index(metadata: bytes, *, minor: int = 3, data_crc32c: int | None = 0, base: Path = VECTOR) -> bytes:
    """`base`'s index (the new vector's by default) with `metadata` in place of its own, that minor version and
    data_crc32c (None: `base`'s), every CRC32C made right again (with spec_reader's CRC32C, not varstore's)."""
    index = base.with_suffix(".index").read_bytes()
    old_size = struct.unpack_from("<Q", index, 32)[0]
    rest = index[(64 + old_size + 7) // 8 * 8 :]  # a dictionary (2.x) starts 8-aligned, so its padding is kept
    body = metadata + bytes(-(64 + len(metadata)) % 8) + rest
    header = bytearray(index[:64])
    struct.pack_into("<H", header, 10, minor)
    struct.pack_into("<Q", header, 32, len(metadata))
    if data_crc32c is not None:
        struct.pack_into("<I", header, 40, data_crc32c)
    struct.pack_into("<I", header, 48, spec_reader.crc32c(body))
    struct.pack_into("<I", header, 60, spec_reader.crc32c(bytes(header[:60])))
    return bytes(header) + body


def _vector_metadata(base: Path = VECTOR) -> bytes:
    index = base.with_suffix(".index").read_bytes()
    return index[64 : 64 + struct.unpack_from("<Q", index, 32)[0]]


def _write_shard(directory: Path, index: bytes, base: Path = VECTOR) -> str:
    (directory / "s.index").write_bytes(index)
    (directory / "s.data").write_bytes(base.with_suffix(".data").read_bytes())
    return str(directory / "s")


def _spec_outcome(prefix: str) -> tuple[str, bool | None]:
    """("refused at open" | "fails verification" | "verifies", whether the data CRC32C is recorded) per spec_reader."""
    try:
        shard = spec_reader.open_shard(prefix)
    except spec_reader.SpecError:
        return "refused at open", None
    try:
        shard.verify()
    except spec_reader.SpecError:
        return "fails verification", shard.data_crc32c_recorded
    return "verifies", shard.data_crc32c_recorded


def _varstore_outcome(prefix: str) -> tuple[str, bool | None]:
    """The same facts as `_spec_outcome`, from varstore."""
    try:
        with varstore.open(prefix) as reader:
            recorded = reader.header.data_crc_recorded
    except VarstoreError:
        return "refused at open", None
    report = varstore.verify(prefix)
    assert report.data_crc_unrecorded == ([] if recorded else [prefix])
    return ("verifies" if report.ok else "fails verification"), recorded


@pytest.mark.parametrize(("member", "minor", "data_crc32c", "expected"), [
    (b'"not recorded"', 1, 0, ("verifies", False)),  # honoured whatever the 1.x minor version says
    (b'"not recorded"', 2, 0, ("verifies", False)),
    (b'"Not recorded"', 3, 0, ("refused at open", None)),
    (b'"not recorded "', 3, 0, ("refused at open", None)),
    (b"null", 3, 0, ("refused at open", None)),
    (b"false", 3, 0, ("refused at open", None)),
    (b"0", 3, 0, ("refused at open", None)),
    (b'["not recorded"]', 3, 0, ("refused at open", None)),
    (b'"not recorded"', 3, spec_reader.crc32c(VECTOR_DATA), ("refused at open", None)),  # even the right CRC
], ids=["minor-1", "minor-2", "capital", "trailing-space", "null", "false", "zero", "array", "right-crc-beside-it"])
def test_a_forged_member_gets_the_same_verdict_from_varstore_and_the_spec_reader(tmp_path, member, minor, data_crc32c,
                                                                                 expected):
    metadata = _vector_metadata().replace(b'"not recorded"', member)
    prefix = _write_shard(tmp_path, _forged_index(metadata, minor=minor, data_crc32c=data_crc32c))
    assert _spec_outcome(prefix) == expected
    assert _varstore_outcome(prefix) == expected


@pytest.mark.parametrize("member", [b'"not recorded"', b"5", b'{"any":"thing"}'])
@pytest.mark.parametrize("name", ["zstd-dict-ndarray-tokens", "zstd-str-documents"])
def test_the_member_in_a_2x_shard_is_ignored_by_varstore_and_the_spec_reader(tmp_path, name, member):
    """§1.2: 2.x does not define it; every 2.x shard records its data CRC32C, checked by a full verification."""
    base = VECTOR.parent / "compressed" / name
    metadata = _vector_metadata(base)
    user = metadata.index(b'"user"')
    metadata = metadata[:user] + b'"data_crc32c":' + member + b"," + metadata[user:]
    prefix = _write_shard(tmp_path, _forged_index(metadata, minor=0, data_crc32c=None, base=base), base)
    assert _spec_outcome(prefix) == _varstore_outcome(prefix) == ("verifies", True)
    wrong = _write_shard(tmp_path, _forged_index(metadata, minor=0, data_crc32c=0, base=base), base)
    assert _spec_outcome(wrong) == _varstore_outcome(wrong) == ("fails verification", True)


def test_minor_version_3_without_the_member_records_its_data_crc_and_a_0_there_is_checked(tmp_path):
    """§1.2: the member says "not recorded", never the header's 0 (nor the minor version) alone."""
    metadata = _vector_metadata().replace(b',"data_crc32c":"not recorded"', b"")
    wrong = _write_shard(tmp_path, _forged_index(metadata, minor=3, data_crc32c=0))
    assert _spec_outcome(wrong) == _varstore_outcome(wrong) == ("fails verification", True)
    right = _write_shard(tmp_path, _forged_index(metadata, minor=3, data_crc32c=spec_reader.crc32c(VECTOR_DATA)))
    assert _spec_outcome(right) == _varstore_outcome(right) == ("verifies", True)


@given(st.integers(0, len(_vector_metadata()) - 1), st.integers(1, 255))
def test_a_changed_metadata_byte_of_the_vector_gets_the_same_verdict_from_varstore_and_the_spec_reader(
        tmp_path_factory, position, change):
    """Every CRC32C made right again, so the metadata's own rules (§1.4, §1.2's member, §2) decide."""
    metadata = bytearray(_vector_metadata())
    metadata[position] ^= change
    prefix = _write_shard(tmp_path_factory.mktemp("flip"), _forged_index(bytes(metadata)))
    assert _varstore_outcome(prefix) == _spec_outcome(prefix)


@given(st.booleans(), st.sampled_from([0, 1, 2, 3, 4, 0xFFFF]),
       st.sampled_from([0, 1, 0xFFFFFFFF, spec_reader.crc32c(VECTOR_DATA)]))
def test_the_member_minor_version_and_header_crc_in_any_combination_get_the_same_verdict(
        tmp_path_factory, member, minor, data_crc32c):
    metadata = _vector_metadata() if member else _vector_metadata().replace(b',"data_crc32c":"not recorded"', b"")
    index = _forged_index(metadata, minor=minor, data_crc32c=data_crc32c)
    prefix = _write_shard(tmp_path_factory.mktemp("fields"), index)
    assert _varstore_outcome(prefix) == _spec_outcome(prefix)


def test_an_older_reader_opens_a_member_in_a_1_1_header_and_fails_its_verification_loudly(tmp_path):
    prefix = _write_shard(tmp_path, _forged_index(_vector_metadata(), minor=1))
    old = spec_reader_1_1.open_shard(prefix)
    assert [old.record(i).tolist() for i in range(len(old))] == [[1, 2, 3], [], [65535, 0, 7]]
    with pytest.raises(spec_reader_1_1.SpecError, match="data_crc32c"):
        old.verify()


def test_a_manifest_entry_recording_the_data_crc_of_an_unrecorded_shard_is_refused(tmp_path):
    write_megatron(str(tmp_path / "corpus"), [np.arange(6, dtype=np.uint16)], "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    manifest_path = tmp_path / "dataset" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["shards"][0]["data_crc32c"] == 0  # the header's 0 (§3.1: the entry equals the header)
    manifest["shards"][0]["data_crc32c"] = spec_reader.crc32c((tmp_path / "corpus.bin").read_bytes())
    manifest.pop("crc32c", None)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(spec_reader.SpecError, match="data_crc32c"):
        spec_reader.open_dataset(str(tmp_path / "dataset"))
    with pytest.raises(VarstoreError, match="data checksum"):
        varstore.open(tmp_path / "dataset")


def _imported(tmp_path: Path, name: str, lengths: tuple[int, ...]) -> Path:
    write_megatron(str(tmp_path / f"{name}-corpus"), [np.arange(n, dtype=np.uint16) for n in lengths], "uint16")
    import_megatron(tmp_path / f"{name}-corpus", tmp_path / name)
    return tmp_path / name


def test_a_local_merge_of_imported_shards_keeps_them_unrecorded_and_they_verify(tmp_path):
    merged = tmp_path / "merged"
    varstore.merge([_imported(tmp_path, "a", (5, 9)), _imported(tmp_path, "b", (3,)) / SHARD_NAME], merged)
    report = varstore.verify(merged)
    assert report.ok and report.data_crc_unrecorded == ["shard-000000", "shard-000001"]
    assert spec_reader.read_dataset(str(merged))["shards"][1]["records"][0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("lone", [False, True], ids=["dataset", "lone-shard"])
def test_merge_into_object_storage_refuses_an_unrecorded_data_crc_before_sending_anything(tmp_path, lone):
    """As cp does: object storage checks every download of a data file by its data CRC32C."""
    from fsspec.implementations.memory import MemoryFileSystem

    recorded_corpus = str(tmp_path / "recorded-corpus")
    write_megatron(recorded_corpus, [np.arange(4, dtype=np.uint16)], "uint16")
    import_megatron(recorded_corpus, tmp_path / "recorded", data_crc=True)
    unrecorded = _imported(tmp_path, "unrecorded", (5, 9))
    url = f"memory://merge-unrecorded-{os.getpid()}-{lone}/ds"
    with pytest.raises(UsageError, match=r"shard-000000.*data CRC32C is not recorded.*--data-crc"):
        varstore.merge([tmp_path / "recorded", unrecorded / SHARD_NAME if lone else unrecorded], url)
    assert not MemoryFileSystem().exists(url)


def test_a_shard_put_into_object_storage_by_other_means_is_refused_by_name_before_its_data_is_fetched(tmp_path, caplog):
    from fsspec.implementations.memory import MemoryFileSystem

    dataset = _imported(tmp_path, "dataset", (5, 9))
    url = f"memory://put-unrecorded-{os.getpid()}/ds"
    memory = MemoryFileSystem()
    for name in sorted(os.listdir(dataset)):
        memory.pipe(f"{url}/{name}", (dataset / name).read_bytes())
    with varstore.open(url, cache_dir=tmp_path / "cache") as remote:
        with pytest.raises(FormatError, match=r"shard-000000\.index: its data CRC32C is not recorded.*--data-crc"):
            remote[0]
    assert "expected CRC32C 0x00000000" not in caplog.text  # no whole download was tried and refused
    assert not any(name.endswith(".data") for _, _, names in os.walk(tmp_path / "cache") for name in names)
    report = varstore.verify(url, cache_dir=tmp_path / "cache")
    assert ["data CRC32C is not recorded" in (check.error or "") for check in report.shards] == [True]


def _checksums_line(capsys, path: Path) -> str:
    assert main(["info", str(path)]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("checksums"))


def test_info_does_not_claim_a_whole_data_file_crc_that_is_not_recorded(tmp_path, capsys):
    unrecorded = _imported(tmp_path, "unrecorded", (5, 9))
    write_megatron(str(tmp_path / "recorded-corpus"), [np.arange(4, dtype=np.uint16)], "uint16")
    import_megatron(tmp_path / "recorded-corpus", tmp_path / "recorded", data_crc=True)
    varstore.merge([tmp_path / "recorded", unrecorded], tmp_path / "mixed")
    for path in (unrecorded, unrecorded / SHARD_NAME):
        line = _checksums_line(capsys, path)
        assert "the whole file's is not recorded" in line and "whole data file only" not in line, line
    assert _checksums_line(capsys, tmp_path / "recorded").endswith("CRC32C of each whole data file only")
    mixed = _checksums_line(capsys, tmp_path / "mixed")
    assert "CRC32C of each whole data file (not recorded in 1 of 2 shards) only" in mixed, mixed
    assert main(["info", "--json", str(tmp_path / "mixed")]) == 0
    shards = json.loads(capsys.readouterr().out)["shards"]
    assert [shard["data_crc_recorded"] for shard in shards] == [True, False]


def test_info_reads_the_member_of_a_1_1_header_and_of_metadata_longer_than_its_first_read(tmp_path, capsys):
    """The member decides (§1.2), not the minor version; a metadata block past the first 4 KiB read is read too."""
    long_user = b'"user":{"megatron":{"documents":3},"pad":"' + b"x" * 5000 + b'"}}'
    metadata = _vector_metadata()
    metadata = metadata[: metadata.index(b'"user"')] + long_user
    (tmp_path / "lone").mkdir()
    prefix = _write_shard(tmp_path / "lone", _forged_index(metadata, minor=1))
    assert _spec_outcome(prefix) == ("verifies", False)
    assert "the whole file's is not recorded" in _checksums_line(capsys, Path(prefix))
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    for suffix in (".index", ".data"):
        os.link(prefix + suffix, dataset / f"s{suffix}")
    write_manifest(dataset, ["s"])
    assert "the whole file's is not recorded" in _checksums_line(capsys, dataset)


def test_info_of_a_dataset_in_object_storage_says_which_shards_record_no_data_crc(tmp_path, capsys):
    """At a URL too, from each index's first bytes, and by a second read when the metadata is longer."""
    from fsspec.implementations.memory import MemoryFileSystem

    long_user = b'"user":{"pad":"' + b"x" * 5000 + b'"}}'
    metadata = _vector_metadata()
    metadata = metadata[: metadata.index(b'"user"')] + long_user
    (tmp_path / "dataset").mkdir()
    _write_shard(tmp_path / "dataset", _forged_index(metadata, minor=1))
    (tmp_path / "dataset" / "t.index").write_bytes(VECTOR.with_suffix(".index").read_bytes())
    (tmp_path / "dataset" / "t.data").write_bytes(VECTOR_DATA)
    write_manifest(tmp_path / "dataset", ["s", "t"])
    url = f"memory://info-unrecorded-{os.getpid()}/ds"
    memory = MemoryFileSystem()
    for name in sorted(os.listdir(tmp_path / "dataset")):
        memory.pipe(f"{url}/{name}", (tmp_path / "dataset" / name).read_bytes())
    assert main(["info", "--json", url]) == 0
    assert [shard["data_crc_recorded"] for shard in json.loads(capsys.readouterr().out)["shards"]] == [False, False]


def test_verify_says_the_data_crc_was_not_recorded_for_a_shard_it_finds_damaged_too(tmp_path, capsys):
    """The damaged records it lists are then all a verification could find, and it says so (§1.2)."""
    metadata = _vector_metadata().replace(b'"dtype":"<u2"', b'"dtype":"|b1"')  # bytes other than 0 or 1: damaged
    prefix = _write_shard(tmp_path, _forged_index(metadata))
    assert _spec_outcome(prefix) == ("fails verification", False)
    report = varstore.verify(prefix)
    assert not report.ok and report.bad_records == [0, 2] and report.data_crc_unrecorded == [prefix]
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    for suffix in (".index", ".data"):
        os.link(prefix + suffix, dataset / f"s{suffix}")
    write_manifest(dataset, ["s"])
    assert main(["verify", "--json", str(dataset)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["data_crc_unrecorded"] == ["s"] and document["shards"][0]["data_crc_recorded"] is False
