"""Round 3 attacks on `varstore import megatron` / `export megatron`: hostile prefixes (FIFO, symlink loop, a
directory), a .bin that changes during the import, racing importers and exporters, a kill mid-import, and a
record too long for the .idx's int32 lengths. Tests of real bugs are strict xfails naming what should happen."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import varstore
from tests.test_megatron_layout import write_megatron
from varstore.conversion import megatron
from varstore.conversion.megatron import MegatronIndex, export_megatron, import_megatron
from varstore.errors import CommandError, FormatError, VarstoreError

SEQUENCES = [np.array([464, 2068, 7586], np.uint16), np.array([40, 588], np.uint16), np.array([1110], np.uint16)]


@pytest.fixture
def corpus(tmp_path):
    """A three-sequence uint16 Megatron prefix in `tmp_path`, one document per sequence."""
    prefix = str(tmp_path / "corpus")
    write_megatron(prefix, SEQUENCES, "uint16")
    return prefix


@pytest.mark.parametrize("make_bin", ["fifo", "directory", "symlink loop"])
def test_a_bin_that_exists_but_is_no_regular_file_is_not_called_missing(tmp_path, corpus, make_bin):
    prefix = str(tmp_path / "odd")
    os.rename(corpus + ".idx", prefix + ".idx")
    {"fifo": os.mkfifo, "directory": os.mkdir, "symlink loop": lambda path: os.symlink(path, path)}[make_bin](prefix + ".bin")
    with pytest.raises(VarstoreError) as raised:
        import_megatron(prefix, str(tmp_path / "dest"))
    assert "does not exist" not in str(raised.value)
    assert not os.path.exists(tmp_path / "dest")


def test_a_bin_that_grows_after_its_idx_was_checked_is_refused_and_leaves_nothing(tmp_path, corpus, monkeypatch):
    checked = megatron.read_megatron_index

    def check_then_append(idx_path: str, bin_size: int) -> MegatronIndex:
        index = checked(idx_path, bin_size)
        with open(corpus + ".bin", "ab") as file:  # another writer appends a sequence's tokens meanwhile
            file.write(np.array([7, 7], np.uint16).tobytes())
        return index

    monkeypatch.setattr(megatron, "read_megatron_index", check_then_append)
    with pytest.raises(FormatError, match="changed during the import"):
        import_megatron(corpus, str(tmp_path / "dest"))
    assert not os.path.exists(tmp_path / "dest")


def test_a_destination_that_is_a_file_is_refused_and_kept(tmp_path, corpus):
    destination = tmp_path / "dest"
    destination.write_text("the user's notes")
    with pytest.raises(OSError):
        import_megatron(corpus, str(destination))
    assert destination.read_text() == "the user's notes"


def test_a_destination_holding_a_users_file_is_refused_and_kept(tmp_path, corpus):
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / "notes.txt").write_text("mine")
    with pytest.raises(CommandError, match="not a dataset's"):
        import_megatron(corpus, str(destination))
    assert os.listdir(destination) == ["notes.txt"]


def test_a_second_import_into_the_same_destination_leaves_the_first_ones_dataset_whole(tmp_path, corpus, monkeypatch):
    destination = str(tmp_path / "dest")
    checked = megatron.read_megatron_index

    def first_import_finishes_meanwhile(idx_path: str, bin_size: int) -> MegatronIndex:
        monkeypatch.setattr(megatron, "read_megatron_index", checked)
        import_megatron(corpus, destination)  # the other process, between this one's destination check and its writes
        return checked(idx_path, bin_size)

    monkeypatch.setattr(megatron, "read_megatron_index", first_import_finishes_meanwhile)
    with pytest.raises(VarstoreError):
        import_megatron(corpus, destination)
    with varstore.open(destination) as reader:
        assert [list(reader[i]) for i in range(len(reader))] == [list(sequence) for sequence in SEQUENCES]


@pytest.mark.parametrize("killed_in", ["_write_shard", "_data_checksums"], ids=["after-the-side-shard", "after-the-link"])
def test_an_import_killed_before_its_manifest_leaves_no_openable_dataset_and_a_clear_refusal(tmp_path, killed_in):
    prefix, destination = str(tmp_path / "corpus"), str(tmp_path / "dest")
    write_megatron(prefix, SEQUENCES, "uint16", document_indices=[0, 2, 3])  # a side shard is written first
    killed = textwrap.dedent(f"""
        import os, signal
        from varstore.conversion import megatron
        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        megatron.{killed_in} = killed
        megatron.import_megatron({prefix!r}, {destination!r}, data_crc=True)
    """)
    completed = subprocess.run([sys.executable, "-c", killed], check=False, capture_output=True, timeout=120)
    assert completed.returncode == -9, completed.stderr
    assert "manifest.json" not in os.listdir(destination)
    with pytest.raises(VarstoreError):
        varstore.open(destination)
    with pytest.raises(CommandError, match="holds a dataset's files"):
        import_megatron(prefix, destination)
    with open(prefix + ".bin", "rb") as file:  # the source is untouched
        assert file.read() == b"".join(sequence.tobytes() for sequence in SEQUENCES)


def test_export_over_an_existing_bin_or_idx_is_refused_and_clobbers_neither(tmp_path, corpus):
    import_megatron(corpus, str(tmp_path / "dataset"))
    for suffix in (".bin", ".idx"):
        target = tmp_path / "out"
        with open(str(target) + suffix, "w") as file:
            file.write("the user's " + suffix)
        with pytest.raises(CommandError, match="already exists"):
            export_megatron(str(tmp_path / "dataset"), str(target))
        assert os.listdir(tmp_path).count("out" + suffix) == 1
        with open(str(target) + suffix) as file:
            assert file.read() == "the user's " + suffix
        os.remove(str(target) + suffix)
        assert not os.path.lexists(str(target) + (".idx" if suffix == ".bin" else ".bin"))


def test_export_over_a_dangling_symlink_is_refused_and_writes_nothing_through_it(tmp_path, corpus):
    import_megatron(corpus, str(tmp_path / "dataset"))
    os.symlink(str(tmp_path / "elsewhere.bin"), str(tmp_path / "out.bin"))
    with pytest.raises(CommandError, match="already exists"):
        export_megatron(str(tmp_path / "dataset"), str(tmp_path / "out"))
    assert not os.path.lexists(tmp_path / "elsewhere.bin")
    assert not os.path.lexists(tmp_path / "out.idx")


def test_an_idx_made_by_another_process_during_export_is_not_deleted(tmp_path, corpus, monkeypatch):
    import_megatron(corpus, str(tmp_path / "dataset"))
    target = str(tmp_path / "out")
    linked = megatron._link_or_copy

    def link_while_another_writes_the_idx(source: str, destination: str) -> bool:
        with open(target + ".idx", "w") as file:
            file.write("another process's index")
        return linked(source, destination)

    monkeypatch.setattr(megatron, "_link_or_copy", link_while_another_writes_the_idx)
    with pytest.raises((VarstoreError, OSError)):
        export_megatron(str(tmp_path / "dataset"), target)
    with open(target + ".idx") as file:
        assert file.read() == "another process's index"
    assert not os.path.exists(target + ".bin")


def test_export_into_a_missing_directory_names_that_directory(tmp_path, corpus, capsys):
    from varstore.cli import main

    import_megatron(corpus, str(tmp_path / "dataset"))
    assert main(["export", "megatron", str(tmp_path / "dataset"), str(tmp_path / "no_such_directory" / "out")]) == 1
    message = capsys.readouterr().err
    assert "no_such_directory" in message and "shard-000000.data" not in message


def test_export_refuses_a_record_too_long_for_megatrons_int32_lengths(tmp_path):
    tokens = 2**31  # one uint8 record one token past int32
    bin_path = str(tmp_path / "long.bin")
    with open(bin_path, "wb") as file:
        file.truncate(tokens)  # sparse: no 2 GiB written
    directory = tmp_path / "dataset"
    directory.mkdir()
    offsets = np.array([0, tokens], np.uint64)
    megatron._write_shard(str(directory / megatron.SHARD_NAME), bin_path,
                          MegatronIndex(np.dtype("uint8"), offsets, np.array([0, 1], np.int64)), {}, False, False)
    with pytest.raises(VarstoreError, match="2147483648"):
        export_megatron(str(directory / megatron.SHARD_NAME), str(tmp_path / "out"))


@pytest.mark.parametrize(("forged", "message"), [
    ([np.array([0, 3, 2, 3], np.int64)], "below document_indices"),
    ([np.array([0, 2], np.int64)], "expected from 0 to the sequence count 3"),
    ([np.array([0, 3], np.int64), np.array([0, 3], np.int64)], "expected one 1-D <i8 record"),
    ([np.array([0, 3], np.int32)], "expected one 1-D <i8 record"),
], ids=["falling", "short-of-the-sequences", "two-records", "int32"])
def test_export_refuses_a_forged_documents_side_shard_and_writes_nothing(tmp_path, forged, message):
    prefix, dataset = str(tmp_path / "corpus"), tmp_path / "dataset"
    write_megatron(prefix, SEQUENCES, "uint16", document_indices=[0, 2, 3])
    import_megatron(prefix, str(dataset))
    with varstore.Writer(dataset / megatron.DOCUMENTS_SHARD_NAME, "ndarray", dtype=forged[0].dtype,
                         overwrite=True) as side:
        for record in forged:
            side.append(record)
    with pytest.raises(FormatError, match=message):
        export_megatron(str(dataset), str(tmp_path / "out"))
    assert not os.path.lexists(tmp_path / "out.bin") and not os.path.lexists(tmp_path / "out.idx")


def test_a_bin_truncated_during_the_checksum_pass_is_an_error_and_leaves_nothing(tmp_path, corpus, monkeypatch):
    checksums = megatron._data_checksums

    def truncate_then_checksum(fd: int, path: str, offsets: np.ndarray, records: bool):
        os.truncate(corpus + ".bin", 2)  # another process cuts the .bin after its size was checked
        return checksums(fd, path, offsets, records)

    monkeypatch.setattr(megatron, "_data_checksums", truncate_then_checksum)
    with pytest.raises(VarstoreError, match="corpus.bin"):
        import_megatron(corpus, str(tmp_path / "dest"), data_crc=True)
    assert not os.path.exists(tmp_path / "dest")
