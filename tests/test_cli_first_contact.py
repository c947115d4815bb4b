"""What a new user of the ``varstore`` command met first (issue 11): each test names the behaviour it proves."""

from __future__ import annotations

import numpy as np
import pytest

import varstore

from .helpers_cli import assert_one_line_error, run, run_json, run_json_lines, run_script, write_dataset

SEPARATOR = 9
JPEG = b"\xff\xd8\xff\xe0 not really a jpeg \x00\x01\xff\xd9"


def _convert(capsys, *args) -> str:
    code, out, err = run(capsys, "convert", *args, "--quiet")
    assert code == 0, err
    return out


def _photos(root):
    """An ImageFolder tree: photos/CLASS/FILE, classes deliberately created out of order, one nested file, and the
    hidden entries real folders hold (left out)."""
    files = {"dog/1.jpg": JPEG + b"dog1", "cat/b.jpg": JPEG + b"catb", "cat/a.jpg": JPEG + b"cata",
             "zebra/deep/z.jpg": JPEG + b"zebra", "ant/x.png": b"\x89PNG ant"}
    for name, data in files.items():
        (root / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "photos" / name).write_bytes(data)
    (root / "photos" / ".DS_Store").write_bytes(b"finder")
    (root / "photos" / "cat" / ".DS_Store").write_bytes(b"finder")
    (root / "photos" / ".ipynb_checkpoints").mkdir()
    (root / "photos" / ".ipynb_checkpoints" / "x.png").write_bytes(b"checkpoint")
    return root / "photos", files


# Item 7: dump --field NAME, with --raw writing that field's bytes.

def test_dump_field_raw_writes_the_exact_image_of_a_labelled_folder(tmp_path, capsys):
    photos, files = _photos(tmp_path)
    _convert(capsys, photos, tmp_path / "images", "--labels")
    for index, name in enumerate(sorted(files)):
        result = run_script("dump", tmp_path / "images", "-i", index, "--field", "image", "--raw")
        assert result.returncode == 0, result.stderr
        assert result.stdout == files[name]


def test_dump_raw_field_of_several_records_writes_them_back_to_back(tmp_path):
    dataset = write_dataset(tmp_path / "ds", [{"blob": bytes([index]) * index} for index in range(5)], codec="msgpack")
    result = run_script("dump", dataset, "--range", "1:4", "--field", "blob", "--raw")
    assert result.returncode == 0 and result.stdout == b"\x01" + b"\x02" * 2 + b"\x03" * 3


def test_dump_field_follows_dotted_paths_into_nested_maps(tmp_path, capsys):
    records = [{"meta": {"caption": f"photo {index}", "size": {"w": index}}, "id": index} for index in range(3)]
    dataset = write_dataset(tmp_path / "ds", records, codec="msgpack")
    lines = run_json_lines(capsys, "dump", dataset, "--field", "meta.caption")
    assert [line["record"] for line in lines] == ["photo 0", "photo 1", "photo 2"]
    code, out, _ = run(capsys, "dump", dataset, "-i", "2", "--field", "meta.size.w")
    assert code == 0 and out == "record 2, field meta.size.w: int\n2\n"


def test_dump_field_text_and_arrays_in_raw_form(tmp_path):
    dataset = write_dataset(tmp_path / "ds", [{"text": "héllo", "mask": np.arange(3, dtype="<u2")}], codec="msgpack")
    assert run_script("dump", dataset, "--field", "text", "--raw").stdout == "héllo".encode()
    assert run_script("dump", dataset, "--field", "mask", "--raw").stdout == np.arange(3, dtype="<u2").tobytes()


@pytest.mark.parametrize(
    ("field", "raw", "fragments"),
    [("nope", False, ["record 1", "no field 'nope'", "has id, meta"]),
     ("meta.caption.deeper", False, ["record 0", "meta.caption is a str, not a map"]),
     ("id", True, ["record 0", "holds an int", "--raw writes bytes, text or arrays"])],
)
def test_dump_field_errors_name_the_store_record_and_field(tmp_path, capsys, field, raw, fragments):
    dataset = write_dataset(tmp_path / "ds", [{"id": 0, "meta": {"caption": "a"}}, {"id": 1, "meta": {}}], codec="msgpack")
    index = ["-i", "1"] if field == "nope" else ["-i", "0"]
    code, _, err = run(capsys, "dump", dataset, *index, "--field", field, *(["--raw"] if raw else []))
    assert_one_line_error(code, err, str(dataset), *fragments)


def test_dump_field_of_records_without_fields_is_a_usage_error(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", ["text"], codec="str")
    code, _, err = run(capsys, "dump", dataset, "--field", "x")
    assert code == 2
    assert_one_line_error(code, err, "--field", "holds str records")


def test_dump_help_shows_the_image_example_that_works(capsys):
    code, out, _ = run(capsys, "dump", "--help")
    assert code == 0
    assert "varstore dump images -i 3 --field image --raw > 3.jpg" in out
    assert "--field NAME" in out


# Item 8: the separator token stays with the document it ends, unless dropped.

@pytest.mark.parametrize(
    ("options", "documents"),
    [([], [[1, 2, 9], [9], [3, 4, 9], [5, 6]]), (["--drop-separator"], [[1, 2], [], [3, 4], [5, 6]])],
)
def test_separator_token_stays_with_the_document_it_ends_unless_dropped(tmp_path, capsys, options, documents):
    np.array([1, 2, 9, 9, 3, 4, 9, 5, 6], np.uint16).tofile(tmp_path / "train.bin")
    _convert(capsys, tmp_path / "train.bin", tmp_path / "ds", "--dtype", "uint16", "--separator", SEPARATOR, *options)
    assert [record.tolist() for record in varstore.open(tmp_path / "ds")] == documents


def test_token_file_keeps_every_token_by_default(tmp_path, capsys):
    tokens = np.random.default_rng(0).integers(0, 12, 10_000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    _convert(capsys, tmp_path / "train.bin", tmp_path / "ds", "--dtype", "uint16", "--separator", SEPARATOR)
    with varstore.open(tmp_path / "ds") as dataset:
        assert np.array_equal(np.concatenate(list(dataset)), tokens)
        assert all(record[-1] == SEPARATOR for record in list(dataset)[:-1])


def test_drop_separator_applies_to_token_files_only(tmp_path, capsys):
    (tmp_path / "lines.txt").write_text("a\n")
    code, _, err = run(capsys, "convert", tmp_path / "lines.txt", tmp_path / "ds", "--drop-separator")
    assert code == 2
    assert_one_line_error(code, err, "--drop-separator does not apply to text sources")


# Item 9: ImageFolder labels; JSON Lines (and Parquet) nulls skipped on request.

def test_folder_labels_follow_the_imagefolder_convention(tmp_path, capsys):
    photos, files = _photos(tmp_path)
    out = _convert(capsys, photos, tmp_path / "images", "--labels", "--metadata", '{"source": "photos"}')
    assert out.startswith("wrote 5 records in 1 shard ")
    # torchvision's find_classes: the sorted sub-folder names, label k the k-th (hidden ones left out).
    labels = ["ant", "cat", "dog", "zebra"]
    with varstore.open(tmp_path / "images") as dataset:
        assert dataset.metadata == {"labels": labels, "source": "photos"}
        records = list(dataset)
    assert [record["path"] for record in records] == sorted(files)
    assert [labels[record["label"]] for record in records] == [name.split("/")[0] for name in sorted(files)]
    assert [record["image"] for record in records] == [files[name] for name in sorted(files)]
    assert all(set(record) == {"image", "label", "path"} for record in records)


def test_folder_without_labels_keeps_name_and_data(tmp_path, capsys):
    photos, files = _photos(tmp_path)
    _convert(capsys, photos, tmp_path / "files")
    with varstore.open(tmp_path / "files") as dataset:
        assert [record["name"] for record in dataset] == sorted(files) and dataset.metadata == {}


@pytest.mark.parametrize(
    ("layout", "fragments"),
    [({"stray.jpg": b"x", "cat/a.jpg": b"y"}, ["stray.jpg", "lies in the top folder"]),
     ({"stray.jpg": b"x"}, ["has none"])],
)
def test_labels_refuse_a_folder_that_is_not_an_imagefolder(tmp_path, capsys, layout, fragments):
    for name, data in layout.items():
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(data)
    code, _, err = run(capsys, "convert", tmp_path / "photos", tmp_path / "ds", "--labels")
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "ds").exists()


def test_labels_and_metadata_labels_conflict_is_a_usage_error(tmp_path, capsys):
    photos, _ = _photos(tmp_path)
    code, _, err = run(capsys, "convert", photos, tmp_path / "ds", "--labels", "--metadata", '{"labels": []}')
    assert code == 2
    assert_one_line_error(code, err, "--metadata sets labels")


LINES_WITH_NULLS = '{"text": "a"}\n{"text": null}\n{"text": "b"}\n{"text": null}\n'


def test_skip_null_leaves_out_null_fields_and_says_how_many(tmp_path, capsys):
    (tmp_path / "docs.jsonl").write_text(LINES_WITH_NULLS)
    out = _convert(capsys, tmp_path / "docs.jsonl", tmp_path / "ds", "--field", "text", "--skip-null")
    assert out.startswith("wrote 2 records in 1 shard ") and out.rstrip().endswith("; left out 2 samples whose text is null")
    assert list(varstore.open(tmp_path / "ds")) == ["a", "b"]


def test_null_field_without_skip_null_names_the_line_and_the_option(tmp_path, capsys):
    (tmp_path / "docs.jsonl").write_text(LINES_WITH_NULLS)
    code, _, err = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "ds", "--field", "text")
    assert_one_line_error(code, err, "docs.jsonl, line 2", "holds null", "--skip-null")


def test_skip_null_leaves_out_null_parquet_values(tmp_path, capsys):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pyarrow.table({"text": ["a", None, "b"]}), tmp_path / "rows.parquet")
    out = _convert(capsys, tmp_path / "rows.parquet", tmp_path / "ds", "--field", "text", "--skip-null")
    assert "left out 1 sample whose text is null" in out
    assert list(varstore.open(tmp_path / "ds")) == ["a", "b"]


def test_skip_null_needs_a_field(tmp_path, capsys):
    (tmp_path / "docs.jsonl").write_text(LINES_WITH_NULLS)
    code, _, err = run(capsys, "convert", tmp_path / "docs.jsonl", tmp_path / "ds", "--skip-null")
    assert code == 2
    assert_one_line_error(code, err, "--skip-null applies to JSON Lines only with --field")


# Item 10: info and stats count rows, elements and tokens of ndarray stores.

def _token_store(tmp_path):
    documents = [np.arange(length, dtype=np.uint16) for length in (1, 3, 6)]
    return write_dataset(tmp_path / "tokens", documents, codec="ndarray", dtype="uint16")


def test_info_of_a_token_store_counts_its_tokens(tmp_path, capsys):
    dataset = _token_store(tmp_path)
    facts = run_json(capsys, "info", dataset)
    assert (facts["length_unit"], facts["rows"], facts["elements"]) == ("tokens", 10, 10)
    code, out, _ = run(capsys, "info", dataset)
    assert code == 0 and "tokens     10 (3.3 tokens per record on average)" in out.splitlines()


def test_info_of_rows_with_a_shape_counts_rows_and_elements(tmp_path, capsys):
    frames = write_dataset(tmp_path / "frames", [np.zeros((length, 80), np.float16) for length in (2, 5)],
                           codec="ndarray", dtype="float16", shape=(80,))
    facts = run_json(capsys, "info", frames)
    assert (facts["length_unit"], facts["rows"], facts["elements"]) == ("rows", 7, 560)
    assert "rows       7 of shape (80,), 560 elements (3.5 rows per record on average)" in run(capsys, "info", frames)[1]
    text = write_dataset(tmp_path / "text", ["a"], codec="str")
    assert run_json(capsys, "info", text)["rows"] is None


def test_stats_of_a_token_store_gives_each_figure_in_tokens(tmp_path, capsys):
    dataset = _token_store(tmp_path)
    facts = run_json(capsys, "stats", dataset)
    assert facts["lengths"] == {"unit": "tokens", "total": 10, "min": 1, "max": 6, "mean": 10 / 3,
                                "percentiles": {"p50": 3, "p90": 6, "p99": 6, "p99.9": 6}}
    lines = run(capsys, "stats", dataset)[1].splitlines()
    assert "total    20 bytes, 10 tokens" in lines and "min      2 bytes, 1 token" in lines
    assert "max      12 bytes, 6 tokens" in lines


# Item 11: messages.

def test_singular_counts_say_one_record_and_one_shard(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "ds", ["only"], codec="str")
    assert "kind       dataset (manifest.json version 1, 1 shard)" in run(capsys, "info", dataset)[1].splitlines()
    code, _, err = run(capsys, "dump", dataset, "-i", "3")
    assert_one_line_error(code, err, "record 3 is out of range for 1 record (valid: -1 to 0)")


@pytest.mark.parametrize("command", ["info", "stats", "dump", "verify"])
def test_a_datasets_manifest_json_stands_for_the_dataset(tmp_path, capsys, command):
    dataset = write_dataset(tmp_path / "ds", ["a", "b"], codec="str")
    code, out, err = run(capsys, command, dataset / "manifest.json")
    assert code == 0, err
    assert out == run(capsys, command, dataset)[1] or command == "verify"


@pytest.mark.parametrize(
    ("selection", "expected"),
    [(["--range", "40:50"], [40, 41, 42, 43]), (["--head", "1000"], list(range(44))), (["--tail", "1000"], list(range(44))),
     (["--range=-100:2"], [0, 1]), (["--range", "50:60"], [])],
)
def test_range_head_and_tail_all_clamp_to_the_records_there_are(tmp_path, capsys, selection, expected):
    dataset = write_dataset(tmp_path / "ds", [str(index) for index in range(44)], codec="str")
    assert [line["index"] for line in run_json_lines(capsys, "dump", dataset, *selection)] == expected


def test_usage_errors_are_one_line_as_the_readme_says(capsys):
    code, out, err = run(capsys, "dump", "x", "--head", "two")
    assert code == 2 and out == ""
    assert err == "varstore dump: argument --head: expected a whole number, got 'two' (see 'varstore dump --help')\n"


# Item 12: convert and merge refuse a folder of other files unless asked, with one shared check.

@pytest.mark.parametrize("command", ["convert", "merge"])
def test_a_folder_of_other_files_is_refused_unless_allowed(tmp_path, capsys, command):
    (tmp_path / "lines.txt").write_text("a\nb\n")
    source = tmp_path / "lines.txt" if command == "convert" else write_dataset(tmp_path / "src", ["a", "b"], codec="str")
    destination = tmp_path / "mine"
    destination.mkdir()
    (destination / "notes.txt").write_text("my notes")
    code, _, err = run(capsys, command, source, destination)
    assert_one_line_error(code, err, str(destination), "not a dataset's (notes.txt)", "--allow-other-files")
    assert sorted(path.name for path in destination.iterdir()) == ["notes.txt"]
    code, _, err = run(capsys, command, source, destination, "--allow-other-files", "--quiet")
    assert code == 0, err
    assert list(varstore.open(destination)) == ["a", "b"]
    assert (destination / "notes.txt").read_text() == "my notes"


def test_convert_replaces_a_dataset_beside_other_files_with_overwrite_alone(tmp_path, capsys):
    (tmp_path / "lines.txt").write_text("a\n")
    dataset = write_dataset(tmp_path / "ds", ["old"], codec="str")
    (dataset / "README").write_text("about this dataset")
    _convert(capsys, tmp_path / "lines.txt", dataset, "--overwrite")
    assert list(varstore.open(dataset)) == ["a"] and (dataset / "README").exists()


def test_merge_never_writes_into_a_dataset_even_with_other_files_allowed(tmp_path, capsys):
    source = write_dataset(tmp_path / "src", ["a"], codec="str")
    taken = write_dataset(tmp_path / "taken", ["b"], codec="str")
    code, _, err = run(capsys, "merge", source, taken, "--allow-other-files")
    assert_one_line_error(code, err, "exists and is not empty", "a dataset's files", "manifest.json")
    assert list(varstore.open(taken)) == ["b"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "options, says, not_says",
    [
        (["--dtype", "float99", "--separator", "5"], ["--dtype float99 is not a dtype", "uint16", "int64"], ["needs"]),
        (["--dtype", "float99"], ["--dtype float99 is not a dtype", "uint16"], ["needs"]),
        (["--dtype", "float32", "--separator", "5"], ["integer type", "not float32"], ["needs"]),
        (["--dtype", "uint16"], ["needs --separator"], ["--dtype (e.g."]),
        (["--separator", "5"], ["needs --dtype"], ["--separator (the"]),
    ],
)
def test_a_token_file_with_a_dtype_it_cannot_take_or_an_option_missing_says_which(tmp_path, capsys, options, says, not_says):
    """A dtype that was given is judged as given (and the token dtypes listed), never reported as missing."""
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    code, out, err = run(capsys, "convert", tmp_path / "train.bin", tmp_path / "out", *options)
    assert code == 2 and out == ""
    assert_one_line_error(code, err, *says)
    assert not any(fragment in err for fragment in not_says), err
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_repair_of_a_url_says_it_repairs_local_datasets_and_how_to_get_one(capsys):
    code, out, err = run(capsys, "repair", "s3://bucket/train")
    assert code == 2 and out == ""
    assert_one_line_error(code, err, "s3://bucket/train", "repair works on a dataset in a local directory", "varstore cp")
    assert "not a dataset directory" not in err
