"""Command-line edges found by attack 11: a convert into its own source, real folders (hidden files, empty or
linked class folders), dotted --field paths, manifest.json as a store argument, wording, --raw to a terminal,
a full standard output, a source merged twice, --range with a negative start, extend_flat errors."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess

import numpy as np
import pytest

import varstore
from tests.helpers_cli import CONSOLE_SCRIPT, assert_one_line_error, run, run_json_lines, write_dataset


def _folder(root, files):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


# Item 1: a convert whose destination is its source folder, or inside it.

@pytest.mark.parametrize("destination", [".", "inside", "inside/deeper"])
def test_convert_refuses_a_destination_in_its_own_source_folder(tmp_path, capsys, destination):
    source = _folder(tmp_path / "photos", {"a.png": b"a", "b.png": b"b"})
    target = source / destination
    code, _, err = run(capsys, "convert", source, target, "--allow-other-files", "--quiet")
    assert code == 2
    assert_one_line_error(code, err, str(source), str(target), "source folder")
    assert sorted(os.listdir(source)) == ["a.png", "b.png"]  # nothing written, no lock or journal left


# Item 2: hidden entries, empty and linked class folders.

def test_labels_leave_out_hidden_files_and_folders_at_every_level(tmp_path, capsys):
    photos = _folder(tmp_path / "photos", {
        "cat/1.png": b"cat", "cat/.DS_Store": b"finder", ".DS_Store": b"finder", "dog/deep/2.png": b"dog",
        "dog/.hidden/3.png": b"hidden", ".ipynb_checkpoints/x.png": b"checkpoint",
    })
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert code == 0, err
    with varstore.open(tmp_path / "images") as dataset:
        assert dataset.metadata == {"labels": ["cat", "dog"]}
        assert [(record["path"], record["label"]) for record in dataset] == [("cat/1.png", 0), ("dog/deep/2.png", 1)]


def test_folder_without_labels_leaves_out_hidden_entries_too(tmp_path, capsys):
    folder = _folder(tmp_path / "docs", {"a.txt": b"a", ".git/config": b"x", "sub/.DS_Store": b"y", "sub/b.txt": b"b"})
    code, _, err = run(capsys, "convert", folder, tmp_path / "ds", "--quiet")
    assert code == 0, err
    with varstore.open(tmp_path / "ds") as dataset:
        assert [record["name"] for record in dataset] == ["a.txt", "sub/b.txt"]


@pytest.mark.parametrize("empty", [{}, {"empty/.DS_Store": b"finder"}])
def test_labels_refuse_an_empty_class_folder_naming_it(tmp_path, capsys, empty):
    photos = _folder(tmp_path / "photos", {"cat/1.png": b"cat", **empty})
    (photos / "empty").mkdir(exist_ok=True)
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert_one_line_error(code, err, str(photos / "empty"), "no file")
    assert not (tmp_path / "images").exists()


def test_labels_follow_a_linked_class_folder_as_imagefolder_does(tmp_path, capsys):
    photos = _folder(tmp_path / "photos", {"dog/1.png": b"dog"})
    os.symlink("dog", photos / "hound")
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert code == 0, err
    with varstore.open(tmp_path / "images") as dataset:
        assert dataset.metadata == {"labels": ["dog", "hound"]}
        assert [(record["path"], record["label"]) for record in dataset] == [("dog/1.png", 0), ("hound/1.png", 1)]


def test_a_link_to_a_folder_below_the_classes_is_refused_as_such(tmp_path, capsys):
    photos = _folder(tmp_path / "photos", {"dog/1.png": b"dog"})
    os.symlink("..", photos / "dog" / "up")
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert_one_line_error(code, err, str(photos / "dog" / "up"), "a link to a folder")


# Item 3: one rule for dotted --field paths, in convert (JSON Lines, Parquet) and dump.

def _sample():
    return {"m": {"c": "nested", "b.x": "dotted inside"}, "a.b": "dotted key", "a": {"b": "shadowed"}}


@pytest.mark.parametrize(("field", "expected"), [("m.c", "nested"), ("a.b", "dotted key"), ("m.b.x", "dotted inside")])
def test_jsonl_and_dump_find_the_same_field(tmp_path, capsys, field, expected):
    (tmp_path / "s.jsonl").write_text(json.dumps(_sample()) + "\n")
    code, _, err = run(capsys, "convert", tmp_path / "s.jsonl", tmp_path / "text", "--field", field, "--quiet")
    assert code == 0, err
    with varstore.open(tmp_path / "text") as dataset:
        assert list(dataset) == [expected]
    write_dataset(tmp_path / "samples", [_sample()], codec="msgpack")
    assert [line["record"] for line in run_json_lines(capsys, "dump", tmp_path / "samples", "--field", field)] == [expected]


def test_parquet_field_takes_a_dotted_path_into_a_struct_column(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"m": [{"c": "x", "blob": b"\x00\x01"}, {"c": "y", "blob": b"\x02"}], "a.b": ["k", "l"]})
    parquet.write_table(table, tmp_path / "t.parquet")
    for field, expected in [("m.c", ["x", "y"]), ("a.b", ["k", "l"]), ("m.blob", [b"\x00\x01", b"\x02"])]:
        code, _, err = run(capsys, "convert", tmp_path / "t.parquet", tmp_path / field, "--field", field, "--quiet")
        assert code == 0, err
        with varstore.open(tmp_path / field) as dataset:
            assert list(dataset) == expected
    code, _, err = run(capsys, "convert", tmp_path / "t.parquet", tmp_path / "none", "--field", "m.z", "--quiet")
    assert_one_line_error(code, err, "no field 'm.z'", "struct<")


def test_missing_field_error_lists_what_is_there_without_contradiction(tmp_path, capsys):
    write_dataset(tmp_path / "samples", [{"a.b": 1, "c": {"d": 2}}], codec="msgpack")
    code, _, err = run(capsys, "dump", tmp_path / "samples", "--field", "c.e")
    assert_one_line_error(code, err, "no field 'c.e': c has d")
    code, out, err = run(capsys, "dump", tmp_path / "samples", "--field", "a.b")
    assert code == 0 and "field a.b: int" in out, err


# Item 4: a dataset's manifest.json stands for the dataset everywhere; usage errors name their command.

def test_merge_repair_and_open_take_a_datasets_manifest_json(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", [b"a", b"b"], codec="bytes")
    manifest = dataset / "manifest.json"
    code, _, err = run(capsys, "merge", manifest, tmp_path / "merged", "--quiet")
    assert code == 0, err
    code, out, err = run(capsys, "repair", manifest)
    assert code == 0 and "nothing to drop" in out, err
    with varstore.open(manifest) as store:
        assert isinstance(store, varstore.ShardedReader) and list(store) == [b"a", b"b"]


def test_an_unknown_option_of_a_command_is_reported_by_that_command(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", [b"a"], codec="bytes")
    code, _, err = run(capsys, "merge", dataset, tmp_path / "out", "--overwrite")
    assert code == 2
    assert err.startswith("varstore merge: unrecognized arguments: --overwrite (see 'varstore merge --help')")


# Item 5: extend_flat names the store and the first record whose values do not fit.

@pytest.mark.parametrize("sharded", [False, True])
def test_extend_flat_overflow_names_the_store_and_the_first_record_that_does_not_fit(tmp_path, sharded):
    path = tmp_path / ("ds" if sharded else "shard")
    writer = (varstore.ShardedWriter if sharded else varstore.Writer)(path, codec="ndarray", dtype="uint8", shape=(2,))
    with pytest.raises(varstore.RecordTypeError) as raised, writer:
        writer.append(np.zeros((1, 2), np.uint8))  # record 0
        # records 1 to 4 hold rows [0], [], [1, 2], [3, 4]; row 3 holds 300, so record 4 does not fit
        writer.extend_flat(np.array([[1, 2], [3, 4], [5, 6], [7, 300], [1, 1]]), [1, 0, 2, 2])
    message = str(raised.value)
    assert str(path) in message and "record 4:" in message and "do not fit uint8" in message


# Item 6: "1 byte", empty datasets, averages that say what they average.

def test_a_single_byte_is_one_byte_everywhere(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("x\n")
    code, out, _ = run(capsys, "convert", tmp_path / "one.txt", tmp_path / "one", "--quiet")
    assert code == 0 and "(1 byte)" in out
    outputs = [run(capsys, *command)[1] for command in (("info", tmp_path / "one"), ("verify", tmp_path / "one"))]
    write_dataset(tmp_path / "blob", [{"b": b"\x07"}], codec="msgpack")
    outputs.append(run(capsys, "dump", tmp_path / "blob")[1])
    # "1 bytes" as a whole number: a rate such as "861 bytes/s" in verify's line is fine.
    assert not any(re.search(r"(?<![\d,.])1 bytes", output) for output in outputs), outputs
    assert "payload    1 byte," in outputs[0] and "1 byte of records checked" in outputs[1] and "<1 byte: 07>" in outputs[2]


def test_info_of_an_empty_dataset_says_it_has_no_shards(tmp_path, capsys):
    write_dataset(tmp_path / "empty", [], codec="ndarray", dtype="uint16")
    code, out, err = run(capsys, "info", tmp_path / "empty")
    assert code == 0, err
    assert "mixed" not in out and "0 of 0" not in out
    assert "format     none yet: the dataset has no shards" in out.splitlines()
    assert "checksums  none yet: the dataset has no shards" in out.splitlines()


def test_info_average_of_rows_says_rows_per_record(tmp_path, capsys):
    write_dataset(tmp_path / "rows", [np.zeros((3, 3), np.float32), np.zeros((4, 3), np.float32)],
                  codec="ndarray", dtype="float32", shape=(3,))
    code, out, _ = run(capsys, "info", tmp_path / "rows")
    assert "rows       7 of shape (3,), 21 elements (3.5 rows per record on average)" in out.splitlines()


# Item 7: --raw to a terminal, a full standard output, a source merged twice.

@pytest.mark.parametrize("field", [[], ["--field", "b"]])
def test_dump_raw_refuses_a_terminal_and_suggests_a_redirect(tmp_path, field):
    dataset = write_dataset(tmp_path / "ds", [{"b": b"\x00\x01"}], codec="msgpack")
    leader, follower = pty.openpty()
    try:
        result = subprocess.run([str(CONSOLE_SCRIPT), "dump", str(dataset), "--raw", *field],
                                stdout=follower, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 2
    assert_one_line_error(result.returncode, result.stderr.decode(), "terminal", "> FILE")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("options", [[], ["--raw"], ["--json"]])
def test_dump_to_a_full_standard_output_names_it(tmp_path, options):
    dataset = write_dataset(tmp_path / "ds", [b"x" * 100] * 3, codec="bytes")
    with open("/dev/full", "wb") as full:
        result = subprocess.run([str(CONSOLE_SCRIPT), "dump", str(dataset), *options],
                                stdout=full, stderr=subprocess.PIPE, timeout=120)
    assert_one_line_error(result.returncode, result.stderr.decode(), "standard output", "No space left on device")


def test_merge_refuses_a_source_given_twice(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", [b"a"], codec="bytes")
    code, _, err = run(capsys, "merge", dataset, dataset, tmp_path / "twice", "--quiet")
    assert code == 2
    assert_one_line_error(code, err, f"{dataset} is given twice", "same records twice")
    code, _, err = run(capsys, "merge", dataset / "manifest.json", dataset / "shard-000000", tmp_path / "twice", "--quiet")
    assert_one_line_error(code, err, "both hold", "shard-000000")
    assert not (tmp_path / "twice").exists()


# Item 8: --range with a negative start, written with a space.

def test_dump_range_with_a_negative_start_takes_a_space(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", [b"a", b"b", b"c", b"d"], codec="bytes")
    for spelling in (["--range", "-3:"], ["--range=-3:"], ["--range", "-3:-1"]):
        lines = run_json_lines(capsys, "dump", dataset, *spelling)
        assert [line["index"] for line in lines] == ([1, 2] if spelling[-1].endswith("-1") else [1, 2, 3])


# Attack 11b, item 1: a --labels class folder that is a link to DST (or to a folder holding it).

@pytest.mark.parametrize("link", ["../images", ".."])
def test_labels_refuse_a_class_folder_linked_to_the_destination_or_above_it(tmp_path, capsys, link):
    photos = _folder(tmp_path / "photos", {"cat/1.png": b"cat"})
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert code == 0, err
    os.symlink(link, photos / "linked")  # class "linked" is DST, or the folder holding DST
    before = sorted(os.listdir(tmp_path / "images"))
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--overwrite", "--quiet")
    assert code == 2
    assert_one_line_error(code, err, str(tmp_path / "images"), str(photos / "linked"), "class folder", "own output")
    assert sorted(os.listdir(tmp_path / "images")) == before
    with varstore.open(tmp_path / "images") as dataset:
        assert [record["path"] for record in dataset] == ["cat/1.png"]


def test_labels_accept_a_class_folder_linked_beside_the_destination(tmp_path, capsys):
    photos = _folder(tmp_path / "photos", {"cat/1.png": b"cat"})
    _folder(tmp_path / "more", {"2.png": b"dog"})
    os.symlink("../more", photos / "dog")
    code, _, err = run(capsys, "convert", photos, tmp_path / "images", "--labels", "--quiet")
    assert code == 0, err
    with varstore.open(tmp_path / "images") as dataset:
        assert [record["path"] for record in dataset] == ["cat/1.png", "dog/2.png"]


# Attack 11b, item 2: the same shard given twice through a hard link.

def test_merge_refuses_a_shard_given_again_through_a_hard_link(tmp_path, capsys):
    first = write_dataset(tmp_path / "a", [b"a", b"b"], codec="bytes")
    second = write_dataset(tmp_path / "c", [b"c"], codec="bytes")
    code, _, err = run(capsys, "merge", first, second, tmp_path / "ac", "--quiet")
    assert code == 0, err
    if os.stat(first / "shard-000000.index").st_ino != os.stat(tmp_path / "ac" / "shard-000000.index").st_ino:
        pytest.skip("this filesystem did not hard-link the shards")
    code, _, err = run(capsys, "merge", first, tmp_path / "ac", tmp_path / "twice", "--quiet")
    assert code == 2
    assert_one_line_error(code, err, f"{first} and {tmp_path / 'ac'} both hold", "same records twice")
    assert not (tmp_path / "twice").exists()


# Attack 11b, item 3: --field through a Parquet column that is not a struct.

@pytest.mark.parametrize("field", ["tags.element", "tags.0", "m.key"])
def test_parquet_field_through_a_list_or_map_column_is_a_usage_error(tmp_path, capsys, field):
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"tags": [["a", "b"]], "m": pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string()))})
    parquet.write_table(table, tmp_path / "t.parquet")
    code, _, err = run(capsys, "convert", tmp_path / "t.parquet", tmp_path / "out", "--field", field, "--quiet")
    assert code == 2
    assert_one_line_error(code, err, f"no field {field!r}", "its column")


# Attack 11b, item 4: digits int() does not read are names, not integer keys.

@pytest.mark.parametrize("field", ["²", "①", "٣", "--1"])
def test_a_field_of_non_ascii_digits_is_a_missing_name_not_a_crash(tmp_path, capsys, field):
    (tmp_path / "s.jsonl").write_text('{"a": "x"}\n')
    code, _, err = run(capsys, "convert", tmp_path / "s.jsonl", tmp_path / "text", f"--field={field}", "--quiet")
    assert_one_line_error(code, err, f"no field {field!r}", "the record has a")
    write_dataset(tmp_path / "samples", [{"a": "x", 3: "int key"}], codec="msgpack")
    code, _, err = run(capsys, "dump", tmp_path / "samples", f"--field={field}")
    assert_one_line_error(code, err, f"no field {field!r}")
    code, out, err = run(capsys, "dump", tmp_path / "samples", "--field", "3")
    assert code == 0 and "int key" in out, err


# Attack 11b, item 5: the --range joining is dump's alone, and stops at "--".

def test_range_joining_leaves_other_commands_and_arguments_after_dashdash_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "--range", [b"a"], codec="bytes")
    write_dataset(tmp_path / "-3:", [b"b"], codec="bytes")
    code, _, err = run(capsys, "merge", "--quiet", "--", "--range", "-3:", "out")
    assert code == 0, err
    with varstore.open(tmp_path / "out") as dataset:
        assert list(dataset) == [b"a", b"b"]
    code, _, err = run(capsys, "stats", "./-3:", "--range", "-3:")
    assert_one_line_error(code, err, "unrecognized arguments: --range -3:")
    code, out, err = run(capsys, "dump", "--json", "--range", "-1:", "--", "-3:")
    assert code == 0 and [json.loads(line)["record"] for line in out.splitlines()] == [{"$bytes": "62"}], err


# Attack 11b, item 6: every command that prints names a full standard output, with no noise at exit.

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["stats"], ["verify"], ["dump"]])
@pytest.mark.parametrize("buffered", [True, False])
def test_a_full_standard_output_is_named_once_by_every_command(tmp_path, command, buffered):
    dataset = write_dataset(tmp_path / "ds", [b"x" * 100] * 3, codec="bytes")
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    if not buffered:
        environment["PYTHONUNBUFFERED"] = "1"
    with open("/dev/full", "wb") as full:
        result = subprocess.run([str(CONSOLE_SCRIPT), command[0], str(dataset), *command[1:]],
                                stdout=full, stderr=subprocess.PIPE, env=environment, timeout=120)
    assert result.returncode == 1
    assert_one_line_error(result.returncode, result.stderr.decode(), f"varstore {command[0]}: writing to standard output failed",
                          "No space left on device")
