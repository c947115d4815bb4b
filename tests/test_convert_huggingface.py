"""Hugging Face `datasets` into varstore: every record equals the row `datasets` itself reads back from the files
it wrote (save_to_disk, to_parquet) or holds (a Dataset object), with damaged inputs refused."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import datasets
import numpy as np
import pyarrow.parquet as pyarrow_parquet
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import varstore
from varstore.conversion import convert
from varstore.conversion.huggingface import convert_huggingface
from varstore.errors import VarstoreError

datasets.disable_progress_bars()


def png(colour: tuple[int, int, int], size: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, "PNG")
    return buffer.getvalue()


FEATURES = datasets.Features({
    "text": datasets.Value("string"),
    "ids": datasets.Sequence(datasets.Value("int32")),
    "scores": datasets.Sequence(datasets.Value("float32")),
    "image": datasets.Image(),
    "label": datasets.ClassLabel(names=["cat", "dog"]),
    "weight": datasets.Value("float64"),
    "blob": datasets.Value("binary"),
    "nested": datasets.Sequence(datasets.Sequence(datasets.Value("int16"))),
})


def sample_dataset(rows: int = 40) -> datasets.Dataset:
    return datasets.Dataset.from_dict({
        "text": [f"row {i} " + "é" * (i % 3) for i in range(rows)],
        "ids": [list(range(i % 7)) for i in range(rows)],
        "scores": [[i / 4, -i / 8] for i in range(rows)],
        "image": [{"bytes": png((i, 2 * i, 255 - i), 1 + i % 3), "path": None} for i in range(rows)],
        "label": [i % 2 for i in range(rows)],
        "weight": [None if i % 5 == 0 else i * 0.5 for i in range(rows)],
        "blob": [bytes([i]) * (i % 4) for i in range(rows)],
        "nested": [[[i, -i], [i + 1]] for i in range(rows)],
    }, features=FEATURES)


def peer_rows(dataset: datasets.Dataset) -> list[dict]:
    """The rows as `datasets` reads them, images as their stored bytes rather than decoded."""
    return list(dataset.cast_column("image", datasets.Image(decode=False)))


def assert_same(record: dict, row: dict) -> None:
    assert set(record) == set(row)
    for name, expected in row.items():
        found = record[name]
        if name == "image":
            assert found == expected["bytes"]
        elif name in ("ids", "scores"):
            dtype = {"ids": np.int32, "scores": np.float32}[name]
            assert isinstance(found, np.ndarray) and found.dtype == dtype
            assert found.tolist() == expected
        elif name == "nested":
            assert [inner.tolist() for inner in found] == expected
            assert all(inner.dtype == np.int16 for inner in found)
        else:
            assert found == expected and type(found) is type(expected)


@pytest.mark.parametrize("workers", [1, 3])
def test_save_to_disk_folder_converts_to_the_rows_datasets_reads_back(tmp_path, workers):
    sample_dataset().save_to_disk(str(tmp_path / "saved"), num_shards=4)
    written = convert(tmp_path / "saved", tmp_path / "out", format="huggingface", workers=workers)
    peer = peer_rows(datasets.load_from_disk(str(tmp_path / "saved")))
    store = varstore.open(tmp_path / "out")
    assert written == len(store) == len(peer) == 40
    for index, row in enumerate(peer):
        assert_same(store[index], row)
    assert store.metadata["huggingface_features"]["label"]["names"] == ["cat", "dog"]


def test_an_arrow_file_and_a_parquet_file_convert_alike(tmp_path):
    dataset = sample_dataset()
    dataset.save_to_disk(str(tmp_path / "saved"))
    dataset.to_parquet(str(tmp_path / "rows.parquet"), batch_size=7)
    (arrow_file,) = [name for name in os.listdir(tmp_path / "saved") if name.endswith(".arrow")]
    # The .arrow suffix tells the format without --format.
    convert(tmp_path / "saved" / arrow_file, tmp_path / "from_arrow")
    convert(tmp_path / "rows.parquet", tmp_path / "from_parquet", format="huggingface", workers=2)
    peer = peer_rows(datasets.load_dataset("parquet", data_files=str(tmp_path / "rows.parquet"), split="train"))
    for name in ("from_arrow", "from_parquet"):
        store = varstore.open(tmp_path / name)
        assert len(store) == len(peer)
        for index, row in enumerate(peer):
            assert_same(store[index], row)


def test_a_shuffled_selected_dataset_object_converts_in_its_own_order(tmp_path):
    dataset = sample_dataset().shuffle(seed=3).select(range(5, 30))
    assert convert_huggingface(dataset, tmp_path / "out", max_shard_records=4) == 25
    store = varstore.open(tmp_path / "out")
    for index, row in enumerate(peer_rows(dataset)):
        assert_same(store[index], row)


@pytest.mark.parametrize(("field", "codec", "expected"), [
    ("ids", "ndarray", lambda row: row["ids"]),
    ("text", "str", lambda row: row["text"]),
    ("image", "bytes", lambda row: row["image"]["bytes"]),
    ("blob", "bytes", lambda row: row["blob"]),
])
def test_one_column_is_stored_with_the_codec_its_type_calls_for(tmp_path, field, codec, expected):
    sample_dataset().save_to_disk(str(tmp_path / "saved"), num_shards=2)
    convert(tmp_path / "saved", tmp_path / "out", format="huggingface", field=field, workers=2)
    store = varstore.open(tmp_path / "out")
    assert store.codec == codec
    found = [store[index] for index in range(len(store))]
    if codec == "ndarray":
        assert all(value.dtype == np.int32 for value in found)
        found = [value.tolist() for value in found]
    assert found == [expected(row) for row in peer_rows(datasets.load_from_disk(str(tmp_path / "saved")))]


def test_a_null_column_value_is_refused_unless_skip_null_leaves_it_out(tmp_path):
    datasets.Dataset.from_dict({"text": ["a", None, "c"]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(VarstoreError, match=r"row 1, column 'text': the field holds null"):
        convert(tmp_path / "saved", tmp_path / "out", format="huggingface", field="text")
    assert convert(tmp_path / "saved", tmp_path / "out", format="huggingface", field="text", skip_null=True) == 2
    assert list(varstore.open(tmp_path / "out")) == ["a", "c"]


def test_an_image_stored_only_as_a_path_is_refused_with_its_row(tmp_path):
    dataset = datasets.Dataset.from_dict({"image": [{"bytes": png((1, 2, 3), 2), "path": None},
                                                    {"bytes": None, "path": "/elsewhere/cat.png"}]},
                                         features=datasets.Features({"image": datasets.Image()}))
    # As a Dataset built from image files holds them; written with its features, not embedded by datasets.
    pyarrow_parquet.write_table(dataset.data.table, tmp_path / "rows.parquet")
    with pytest.raises(VarstoreError, match=r"rows.parquet, row 1: the Image holds no bytes, only a path"):
        convert(tmp_path / "rows.parquet", tmp_path / "out", format="huggingface")


def test_a_dataset_dict_folder_is_refused_naming_its_splits(tmp_path):
    datasets.DatasetDict({"train": sample_dataset(4), "test": sample_dataset(2)}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(VarstoreError, match=r"a DatasetDict of splits \(test, train\)"):
        convert(tmp_path / "dict", tmp_path / "out", format="huggingface")
    assert convert(tmp_path / "dict" / "test", tmp_path / "out", format="huggingface") == 2


@pytest.mark.parametrize("listed", ["../outside.arrow", "missing.arrow", 7])
def test_a_state_json_naming_files_outside_or_absent_is_refused(tmp_path, listed):
    sample_dataset(3).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "outside.arrow").write_bytes(b"")
    state = json.loads((tmp_path / "saved" / "state.json").read_text())
    state["_data_files"] = [{"filename": listed}]
    (tmp_path / "saved" / "state.json").write_text(json.dumps(state))
    with pytest.raises(VarstoreError, match=r"state.json: (the data file .* is not a file name|lists missing)"):
        convert(tmp_path / "saved", tmp_path / "out", format="huggingface")
    assert not (tmp_path / "out").exists()


def test_a_truncated_arrow_file_is_refused_and_nothing_is_left(tmp_path):
    sample_dataset().save_to_disk(str(tmp_path / "saved"))
    (arrow_file,) = (tmp_path / "saved").glob("*.arrow")
    data = arrow_file.read_bytes()
    arrow_file.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(VarstoreError, match=r"\.arrow"):
        convert(tmp_path / "saved", tmp_path / "out", format="huggingface")
    assert not (tmp_path / "out").exists()


def test_the_cli_converts_a_save_to_disk_folder(tmp_path):
    sample_dataset(6).save_to_disk(str(tmp_path / "saved"))
    done = subprocess.run([sys.executable, "-m", "varstore", "convert", str(tmp_path / "saved"), str(tmp_path / "out"),
                           "--format", "huggingface", "--field", "text", "--quiet"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "wrote 6 records" in done.stdout
    assert list(varstore.open(tmp_path / "out")) == [f"row {i} " + "é" * (i % 3) for i in range(6)]


@given(st.lists(st.tuples(st.text(max_size=8), st.lists(st.integers(-2**63, 2**63 - 1), max_size=5),
                          st.one_of(st.none(), st.binary(max_size=6))), max_size=12))
def test_any_rows_survive_parquet_written_by_datasets(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("rows")
    features = datasets.Features({"text": datasets.Value("string"), "ids": datasets.Sequence(datasets.Value("int64")),
                                  "blob": datasets.Value("binary")})
    dataset = datasets.Dataset.from_dict({"text": [row[0] for row in rows], "ids": [row[1] for row in rows],
                                          "blob": [row[2] for row in rows]}, features=features)
    dataset.to_parquet(str(folder / "rows.parquet"))
    convert(folder / "rows.parquet", folder / "out", format="huggingface")
    store = varstore.open(folder / "out")
    assert [(record["text"], record["ids"].tolist(), record["blob"]) for record in store] == [
        (row["text"], row["ids"], row["blob"]) for row in dataset]
