"""A shard whose data CRC32C is not recorded (spec/FORMAT.md §1.2, format 1.3): what the Megatron import writes by
default, without reading the .bin's payload, and what a reader, a full verification and an older reader make of it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.cli import main
from varstore.conversion.megatron import SHARD_NAME, import_megatron
from varstore.errors import FormatError

from . import spec_reader, spec_reader_1_1
from .test_megatron_layout import write_megatron

VECTOR = Path(__file__).resolve().parent.parent / "spec" / "vectors" / "ndarray-data-crc-unrecorded"


def _read_bytes_of_this_process() -> int:
    """Bytes this process has read through read(2)/pread(2) so far, page cache hits included (/proc/self/io rchar)."""
    with open("/proc/self/io") as file:
        return next(int(line.split()[1]) for line in file if line.startswith("rchar:"))


def _sparse_corpus(prefix: str, tokens: int) -> None:
    """A Megatron corpus of one sequence of `tokens` uint16 tokens (dtype code 8), its .bin sparse (nothing written)."""
    with open(prefix + ".bin", "wb") as file:
        file.truncate(2 * tokens)
    with open(prefix + ".idx", "wb") as file:
        file.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 1, 2) + struct.pack("<iqqq", tokens, 0, 0, 1))


@pytest.mark.timeout(600)
def test_default_import_reads_no_payload_and_data_crc_reads_it_once(tmp_path):
    tokens = 32 << 20  # a 64 MiB .bin
    prefix = str(tmp_path / "corpus")
    _sparse_corpus(prefix, tokens)
    import_megatron(prefix, tmp_path / "warm-up")  # imports and first-call costs are not the import's reads
    before = _read_bytes_of_this_process()
    import_megatron(prefix, tmp_path / "dataset")
    default_read = _read_bytes_of_this_process() - before
    before = _read_bytes_of_this_process()
    import_megatron(prefix, tmp_path / "with-crc", data_crc=True)
    with_crc_read = _read_bytes_of_this_process() - before
    assert default_read < 1 << 20, default_read  # the .idx, two 4 KiB edges and the directory's small files
    assert with_crc_read >= 2 * tokens, with_crc_read


def test_default_import_says_so_in_the_format_and_data_crc_records_the_bins_crc(tmp_path):
    sequences = [np.arange(n, dtype=np.uint16) for n in (5, 0, 3000, 7)]
    write_megatron(str(tmp_path / "corpus"), sequences, "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "default")
    import_megatron(tmp_path / "corpus", tmp_path / "recorded", data_crc=True)
    bin_crc = spec_reader.crc32c((tmp_path / "corpus.bin").read_bytes())  # the spec-only CRC32C, not varstore's
    default = spec_reader.open_shard(str(tmp_path / "default" / SHARD_NAME))
    recorded = spec_reader.open_shard(str(tmp_path / "recorded" / SHARD_NAME))
    assert (default.header["minor_version"], default.header["data_crc32c"]) == (3, 0)
    assert default.metadata["data_crc32c"] == "not recorded" and not default.data_crc32c_recorded
    assert (recorded.header["minor_version"], recorded.header["data_crc32c"]) == (1, bin_crc)
    assert "data_crc32c" not in recorded.metadata
    manifest = json.loads((tmp_path / "default" / "manifest.json").read_text())
    assert manifest["shards"][0]["data_crc32c"] == 0
    for name in ("default", "recorded"):
        with varstore.open(tmp_path / name) as reader:
            assert [record.tolist() for record in reader] == [sequence.tolist() for sequence in sequences]


def test_verify_checks_the_rest_and_says_the_data_crc_was_not_recorded(tmp_path, capsys):
    write_megatron(str(tmp_path / "corpus"), [np.arange(9000, dtype=np.uint16), np.arange(3, dtype=np.uint16)], "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    import_megatron(tmp_path / "corpus", tmp_path / "recorded", data_crc=True)
    report = varstore.verify(tmp_path / "dataset")
    assert report.ok and report.data_crc_unrecorded == [SHARD_NAME]
    assert varstore.verify(tmp_path / "recorded").data_crc_unrecorded == []
    assert main(["verify", str(tmp_path / "dataset")]) == 0
    out = capsys.readouterr().out
    assert f"data CRC32C of 1 shard ({SHARD_NAME}) is not recorded" in out and out.startswith("ok: 2 records")
    assert main(["verify", str(tmp_path / "recorded")]) == 0
    assert "not recorded" not in capsys.readouterr().out
    assert main(["verify", "--json", str(tmp_path / "dataset")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["data_crc_unrecorded"] == [SHARD_NAME] and document["shards"][0]["data_crc_recorded"] is False


def test_without_the_data_crc_a_changed_edge_is_refused_and_a_changed_middle_is_not_found(tmp_path):
    """What the edge checksum still catches at open, and the limit a shard without its data CRC32C has."""
    write_megatron(str(tmp_path / "corpus"), [np.arange(10000, dtype=np.uint16)], "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset")
    with open(tmp_path / "corpus.bin", "r+b") as file:  # the same inode as the dataset's data file
        file.seek(9000)
        file.write(b"\xff")
    report = varstore.verify(tmp_path / "dataset")
    assert report.ok and report.data_crc_unrecorded == [SHARD_NAME]
    with open(tmp_path / "corpus.bin", "r+b") as file:
        file.seek(10)
        file.write(b"\xff")
    with pytest.raises(FormatError, match="first/last 4 KiB"):
        varstore.open(tmp_path / "dataset" / SHARD_NAME)
    assert not varstore.verify(tmp_path / "dataset").ok


def test_with_record_checksums_a_changed_middle_is_found(tmp_path):
    write_megatron(str(tmp_path / "corpus"), [np.arange(10000, dtype=np.uint16)] * 2, "uint16")
    import_megatron(tmp_path / "corpus", tmp_path / "dataset", checksums=True)
    with open(tmp_path / "corpus.bin", "r+b") as file:
        file.seek(19000)
        file.write(b"\xff")
    report = varstore.verify(tmp_path / "dataset")
    assert not report.ok and report.bad_records == [0] and report.data_crc_unrecorded == []


@pytest.mark.parametrize(("member", "header_crc", "message"), [
    ('"recorded"', 0, "its one value is 'not recorded'"),
    ('"not recorded"', 1, "it must then be 0"),
], ids=["other-value", "nonzero-header"])
def test_varstore_refuses_an_unrecorded_member_it_cannot_trust_at_open(tmp_path, member, header_crc, message):
    index = bytearray(VECTOR.with_suffix(".index").read_bytes())
    metadata = index[64 : 64 + int.from_bytes(index[32:40], "little")]
    changed = bytes(metadata).replace(b'"not recorded"', member.encode())
    offsets_start = (64 + len(metadata) + 7) // 8 * 8
    body = changed + bytes(-(64 + len(changed)) % 8) + bytes(index[offsets_start:])
    header = bytearray(index[:64])
    header[32:40] = len(changed).to_bytes(8, "little")
    header[40:44] = header_crc.to_bytes(4, "little")
    header[48:52] = spec_reader.crc32c(body).to_bytes(4, "little")
    header[60:64] = spec_reader.crc32c(bytes(header[:60])).to_bytes(4, "little")
    (tmp_path / "s.index").write_bytes(bytes(header) + body)
    (tmp_path / "s.data").write_bytes(VECTOR.with_suffix(".data").read_bytes())
    with pytest.raises(FormatError, match=message):
        varstore.open(tmp_path / "s")
    with pytest.raises(spec_reader.SpecError, match="data_crc32c"):
        spec_reader.open_shard(str(tmp_path / "s"))


def test_an_older_reader_reads_the_records_and_fails_verification_loudly():
    """§7.2: a 1.1 reader ignores the member; its verification finds the data's CRC32C is not the header's 0."""
    old = spec_reader_1_1.open_shard(str(VECTOR))
    new = spec_reader.open_shard(str(VECTOR))
    assert [old.record(i).tolist() for i in range(len(old))] == [new.record(i).tolist() for i in range(len(new))]
    new.verify()
    with pytest.raises(spec_reader_1_1.SpecError, match="data_crc32c"):
        old.verify()


@given(st.lists(st.lists(st.integers(0, 2**16 - 1), max_size=40), max_size=12), st.booleans())
def test_imported_shards_read_back_and_verify_with_the_crc_recorded_or_not(tmp_path_factory, sequences, data_crc):
    directory = tmp_path_factory.mktemp("import")
    arrays = [np.array(sequence, np.uint16) for sequence in sequences]
    write_megatron(str(directory / "corpus"), arrays, "uint16")
    import_megatron(directory / "corpus", directory / "dataset", data_crc=data_crc)
    shard = spec_reader.open_shard(str(directory / "dataset" / SHARD_NAME))
    shard.verify()
    assert shard.data_crc32c_recorded == data_crc
    assert [shard.record(i).tolist() for i in range(len(shard))] == sequences
    report = varstore.verify(directory / "dataset")
    assert report.ok and report.data_crc_unrecorded == ([] if data_crc else [SHARD_NAME])


def test_cli_import_data_crc_option_records_it(tmp_path):
    write_megatron(str(tmp_path / "corpus"), [np.arange(4, dtype=np.uint16)], "uint16")
    command = [sys.executable, "-m", "varstore", "import", "megatron", str(tmp_path / "corpus")]
    subprocess.run([*command, str(tmp_path / "default")], check=True, capture_output=True, timeout=120)
    subprocess.run([*command, str(tmp_path / "recorded"), "--data-crc"], check=True, capture_output=True, timeout=120)
    assert spec_reader.open_shard(str(tmp_path / "default" / SHARD_NAME)).header["minor_version"] == 3
    assert spec_reader.open_shard(str(tmp_path / "recorded" / SHARD_NAME)).header["minor_version"] == 1
    assert os.path.samefile(tmp_path / "corpus.bin", tmp_path / "default" / f"{SHARD_NAME}.data")


def test_cp_to_object_storage_refuses_an_unrecorded_data_crc_before_sending_it_and_a_local_cp_keeps_it(tmp_path):
    from fsspec.implementations.memory import MemoryFileSystem

    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, [np.arange(n, dtype=np.uint16) for n in (5, 9)], "uint16")
    import_megatron(prefix, tmp_path / "dataset")
    url = f"memory://cp-unrecorded-{os.getpid()}/ds"
    with pytest.raises(varstore.errors.UsageError, match=r"shard-000000.*data CRC32C is not recorded.*--data-crc"):
        varstore.copy(tmp_path / "dataset", url)
    assert not MemoryFileSystem().exists(url)  # nothing of it was sent (or all of it was removed)
    varstore.copy(tmp_path / "dataset", tmp_path / "local-copy")
    with varstore.open(tmp_path / "local-copy") as copied:
        assert [list(copied[i]) for i in range(len(copied))] == [list(range(5)), list(range(9))]
    import_megatron(prefix, tmp_path / "recorded", data_crc=True)
    varstore.copy(tmp_path / "recorded", url)
    with varstore.open(url, cache_dir=tmp_path / "cache") as remote:
        assert list(remote[1]) == list(range(9))


def test_info_json_gives_no_data_crc_for_a_shard_that_records_none(tmp_path, capsys):
    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, [np.arange(7, dtype=np.uint16)], "uint16")
    import_megatron(prefix, tmp_path / "unrecorded")
    import_megatron(prefix, tmp_path / "recorded", data_crc=True)
    facts = {}
    for name in ("unrecorded", "recorded"):
        assert main(["info", "--json", str(tmp_path / name / SHARD_NAME)]) == 0
        facts[name] = json.loads(capsys.readouterr().out)["data_crc32c"]
    bin_crc = varstore.format.checksum.crc32c(np.arange(7, dtype="<u2").tobytes())
    assert facts == {"unrecorded": None, "recorded": bin_crc}
