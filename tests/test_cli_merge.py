"""``varstore merge``: datasets and shards combine in order, by hard link or copy, never across codecs."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME
from varstore.local.manifest_file import read_manifest

from .helpers_cli import assert_one_line_error, run, run_script, write_dataset, write_shard


@pytest.fixture
def parts(tmp_path):
    """Two datasets and a lone shard of str records: ("a0".."a4" in 3 shards, "b0".."b1" in 1, "c0")."""
    first = write_dataset(tmp_path / "a", [f"a{index}" for index in range(5)], codec="str", max_shard_records=2)
    second = write_dataset(tmp_path / "b", ["b0", "b1"], codec="str")
    lone = write_shard(tmp_path / "c", ["c0"], codec="str")
    return first, second, lone


def _merge(capsys, *args):
    code, out, err = run(capsys, "merge", *args, "--quiet")
    assert code == 0, err
    return out


def test_merged_dataset_holds_every_record_in_order_through_hard_links(capsys, tmp_path, parts):
    first, second, lone = parts
    out = _merge(capsys, first, second, lone, tmp_path / "all")
    assert out == f"merged 3 sources into {tmp_path / 'all'}: 5 shards, 8 records, 16 bytes; 10 files hard-linked, 0 copied\n"
    with varstore.open(tmp_path / "all") as merged:
        assert list(merged) == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "c0"]
        merged.verify()
        sources = [*varstore.open(first).shard_paths, *varstore.open(second).shard_paths, str(lone)]
        for source, target in zip(sources, merged.shard_paths):
            for source_file, target_file in zip(varstore.format.header.shard_paths(source), varstore.format.header.shard_paths(target)):
                assert os.path.samefile(source_file, target_file)


def test_dataset_shards_keep_their_manifest_entries(capsys, tmp_path, parts):
    first, second, _ = parts
    _merge(capsys, first, second, tmp_path / "all")
    originals = read_manifest(str(first)).shards + read_manifest(str(second)).shards
    merged = read_manifest(str(tmp_path / "all")).shards
    assert [dataclasses.replace(entry, name="") for entry in merged] == [dataclasses.replace(entry, name="") for entry in originals]
    assert [entry.name for entry in merged] == [f"shard-{index:06d}" for index in range(4)]


def test_copy_makes_independent_files_with_the_same_bytes(capsys, tmp_path, parts):
    first, _, lone = parts
    out = _merge(capsys, first, lone, tmp_path / "copied", "--copy")
    assert out.endswith("0 files hard-linked, 8 copied\n")
    merged = varstore.open(tmp_path / "copied")
    assert list(merged) == ["a0", "a1", "a2", "a3", "a4", "c0"]
    for source, target in zip([*varstore.open(first).shard_paths, str(lone)], merged.shard_paths):
        for source_file, target_file in zip(varstore.format.header.shard_paths(source), varstore.format.header.shard_paths(target)):
            assert not os.path.samefile(source_file, target_file)
            assert Path(source_file).read_bytes() == Path(target_file).read_bytes()


def test_files_are_copied_where_links_are_impossible(capsys, tmp_path, parts, monkeypatch):
    def refuse(source, destination, **options):
        raise OSError(errno.EXDEV, "Invalid cross-device link", source)

    monkeypatch.setattr(os, "link", refuse)
    first, _, _ = parts
    assert _merge(capsys, first, tmp_path / "other-device").endswith("0 files hard-linked, 6 copied\n")
    assert list(varstore.open(tmp_path / "other-device")) == ["a0", "a1", "a2", "a3", "a4"]


def test_different_codecs_are_refused_and_nothing_is_created(capsys, tmp_path, parts):
    first, _, _ = parts
    tokens = write_shard(tmp_path / "tokens", [np.arange(3, dtype=np.uint16)], codec="ndarray", dtype="uint16")
    code, _, err = run(capsys, "merge", first, tokens, tmp_path / "mixed")
    assert_one_line_error(code, err, "cannot merge different codecs", "tokens is ndarray: uint16", "is str")
    assert not (tmp_path / "mixed").exists()


def test_existing_destination_is_refused(capsys, tmp_path, parts):
    first, second, _ = parts
    code, _, err = run(capsys, "merge", first, second)
    assert_one_line_error(code, err, str(second), "exists and is not empty")
    assert list(varstore.open(second)) == ["b0", "b1"]


def test_metadata_is_kept_when_sources_agree_and_set_by_option(capsys, tmp_path):
    same = [write_dataset(tmp_path / name, [b"x"], metadata={"v": 1}) for name in ("p", "q")]
    _merge(capsys, *same, tmp_path / "agreed")
    assert varstore.open(tmp_path / "agreed").metadata == {"v": 1}
    other = write_dataset(tmp_path / "r", [b"y"], metadata={"v": 2})
    code, _, err = run(capsys, "merge", same[0], other, tmp_path / "differ", "--quiet")
    assert code == 0 and "the sources' metadata differ" in err
    assert varstore.open(tmp_path / "differ").metadata == {}
    _merge(capsys, same[0], other, tmp_path / "given", "--metadata", '{"v": 3}')
    assert varstore.open(tmp_path / "given").metadata == {"v": 3}


def test_failure_midway_leaves_nothing_behind(capsys, tmp_path, parts, monkeypatch):
    real_link, linked = os.link, []

    def link_twice_then_fail(source, destination, **options):
        if len(linked) == 2:
            raise OSError(errno.EIO, "Input/output error", source)
        real_link(source, destination, **options)
        linked.append(destination)

    monkeypatch.setattr(os, "link", link_twice_then_fail)
    first, _, _ = parts
    code, _, err = run(capsys, "merge", first, tmp_path / "broken")
    assert_one_line_error(code, err, "Input/output error")
    assert len(linked) == 2 and not (tmp_path / "broken").exists()


def test_merge_through_the_console_script_then_verify(tmp_path, parts):
    first, second, lone = parts
    merged = run_script("merge", first, second, lone, tmp_path / "all")
    assert merged.returncode == 0, merged.stderr
    verified = run_script("verify", tmp_path / "all", "--json")
    assert verified.returncode == 0
    assert json.loads(verified.stdout)["records"] == 8
    assert (tmp_path / "all" / MANIFEST_NAME).exists()


def test_disk_full_while_copying_names_the_file_and_leaves_nothing(capsys, tmp_path, parts, monkeypatch):
    real_write, written = os.write, []

    def full_after_one_file(fd, data):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(fd)
        return real_write(fd, data)

    first, _, _ = parts
    monkeypatch.setattr(os, "write", full_after_one_file)
    code, _, err = run(capsys, "merge", first, tmp_path / "full", "--copy")
    monkeypatch.undo()
    assert_one_line_error(code, err, str(tmp_path / "full" / "shard-000000"), "No space left on device", "copying")
    assert code == 1 and not (tmp_path / "full").exists()


def test_disk_full_on_a_real_filesystem_names_the_file(capsys, tmp_path):
    from .helpers_tmpfs import mounted_tmpfs

    source = write_dataset(tmp_path / "src", [bytes([index]) * 20_000 for index in range(20)], max_shard_records=5)
    with mounted_tmpfs(256 << 10) as root:  # room for two of the four 100 KB shards
        (root / "existing").mkdir()
        code, _, err = run(capsys, "merge", source, root / "existing", "--copy", "--quiet")
        assert_one_line_error(code, err, str(root / "existing" / "shard-"), "No space left on device")
        assert code == 1 and os.listdir(root / "existing") == []


def test_failure_in_a_new_nested_destination_removes_the_directories_it_made(capsys, tmp_path, parts, monkeypatch):
    monkeypatch.setattr(os, "link", lambda *args, **options: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    first, _, _ = parts
    code, _, err = run(capsys, "merge", first, tmp_path / "new" / "deeper" / "merged")
    assert_one_line_error(code, err, str(tmp_path / "new" / "deeper" / "merged" / "shard-000000"), "linking")
    assert not (tmp_path / "new").exists()
