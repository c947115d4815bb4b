"""litdata chunk folders into varstore: the folders under tests/data/litdata/ were written by litdata's own
BinaryWriter (tools/make_peer_fixtures.py), uncompressed and in each of its zstd layouts; every record must
equal the sample given to it, and damaged or hostile folders are refused with the chunk file and item named."""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import varstore
from tests.peer_samples import (
    LITDATA_SAMPLES,
    PICKLE_SAMPLES,
    litdata_media_sample,
    litdata_pickle_sample,
    litdata_sample,
    litdata_text_sample,
    pixels,
)
from varstore.conversion import convert
from varstore.conversion.litdata import _ItemError, _json_leaf
from varstore.errors import VarstoreError

FIXTURES = Path(__file__).parent / "data" / "litdata"
LAYOUTS = ["plain", "zstd-batch", "zstd-chunk", "zstd-sample"]


def assert_sample(record: dict, sample: dict) -> None:
    assert list(record) == list(sample)  # the pytree's key order
    for name, value in sample.items():
        found = record[name]
        if isinstance(value, np.ndarray):
            assert isinstance(found, np.ndarray) and found.dtype == value.dtype and found.shape == value.shape
            assert np.array_equal(found, value)
        elif name == "picture":  # raw pixels in litdata, PNG in varstore: the same pixels
            assert found.startswith(b"\x89PNG") and pixels(found) == np.asarray(value).tolist()
        elif name == "photo":  # a JPEG file, stored as it is: JPEG bytes close to the image it was saved from
            assert found.startswith(b"\xff\xd8")
            decoded = np.asarray(Image.open(io.BytesIO(found)).convert("RGB"), dtype=np.int16)
            assert decoded.shape == np.asarray(value).shape
            assert np.abs(decoded - np.asarray(value, dtype=np.int16)).max() <= 3
        else:
            assert found == value and type(found) is type(value), name


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("workers", [1, 3])
def test_binarywriter_folders_convert_to_the_samples_it_was_given(tmp_path, layout, workers):
    assert len(json.loads((FIXTURES / layout / "index.json").read_text())["chunks"]) > 3  # parts cross chunks
    written = convert(FIXTURES / layout, tmp_path / "out", format="litdata", workers=workers)
    store = varstore.open(tmp_path / "out")
    assert written == len(store) == LITDATA_SAMPLES
    for index in range(LITDATA_SAMPLES):
        assert_sample(store[index], litdata_sample(index))


def test_chunks_of_arrow_rows_convert_to_the_samples_given(tmp_path):
    # Dict samples of plain leaves: litdata keeps them only as Arrow rows in each chunk's footer.
    assert (FIXTURES / "text" / "chunk-0-0.bin").read_bytes().endswith(b"LDARW01\0")
    assert convert(FIXTURES / "text", tmp_path / "out", format="litdata", workers=2) == LITDATA_SAMPLES
    for index, record in enumerate(varstore.open(tmp_path / "out")):
        sample = litdata_text_sample(index)
        assert record["tokens"].dtype == np.int64 and record["tokens"].tolist() == sample.pop("tokens")
        assert {name: value for name, value in record.items() if name != "tokens"} == sample


def test_pickle_leaves_are_refused_unless_allowed(tmp_path):
    with pytest.raises(VarstoreError, match=r"a pickle leaf; unpickling runs whatever code"):
        convert(FIXTURES / "pickle", tmp_path / "out", format="litdata")
    assert not (tmp_path / "out").exists()
    assert convert(FIXTURES / "pickle", tmp_path / "out", format="litdata", allow_pickle=True) == PICKLE_SAMPLES
    expected = [[number, bytes(value)] for number, value in map(litdata_pickle_sample, range(PICKLE_SAMPLES))]
    assert list(varstore.open(tmp_path / "out")) == expected


def copied(tmp_path: Path, layout: str = "plain") -> Path:
    target = tmp_path / layout
    shutil.copytree(FIXTURES / layout, target)
    return target


def edit_index(folder: Path, change) -> None:
    index = json.loads((folder / "index.json").read_text())
    change(index)
    (folder / "index.json").write_text(json.dumps(index))


def item_start(chunk: bytes, position: int) -> int:
    """Where item `position` of an uncompressed litdata chunk starts, from its offsets as litdata reads them."""
    return struct.unpack_from("<I", chunk, 4 + 4 * position)[0]


def test_a_truncated_chunk_is_refused_naming_it(tmp_path):
    folder = copied(tmp_path)
    chunk = folder / "chunk-0-2.bin"
    chunk.write_bytes(chunk.read_bytes()[:-9])
    with pytest.raises(VarstoreError, match=r"chunk-0-2.bin: .* bytes, and index.json says"):
        convert(folder, tmp_path / "out", format="litdata")
    edit_index(folder, lambda index: index["chunks"][2].update(chunk_bytes=chunk.stat().st_size))
    with pytest.raises(VarstoreError, match=r"chunk-0-2.bin: its item offsets"):
        convert(folder, tmp_path / "out", format="litdata")
    assert not (tmp_path / "out").exists()


def test_an_item_whose_leaf_sizes_disagree_with_its_bytes_is_refused_naming_chunk_and_item(tmp_path):
    folder = copied(tmp_path)
    chunk = folder / "chunk-0-3.bin"
    data = bytearray(chunk.read_bytes())
    start = item_start(data, 1)
    (size,) = struct.unpack_from("<I", data, start + 4)  # the str leaf's size
    struct.pack_into("<I", data, start + 4, size + 3)
    chunk.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"chunk-0-3.bin, item 1: its leaves' sizes"):
        convert(folder, tmp_path / "out", format="litdata")


def test_a_numpy_leaf_whose_shape_outgrows_its_bytes_is_refused(tmp_path):
    folder = copied(tmp_path)
    chunk = folder / "chunk-0-1.bin"
    data = bytearray(chunk.read_bytes())
    start = item_start(data, 0)
    sizes = struct.unpack_from("<8I", data, start)
    numpy_leaf = start + 4 * 8 + sum(sizes[:4])  # after int, str, float and the 1-D tokens
    struct.pack_into("<I", data, numpy_leaf + 8, 1000)  # its first dimension
    chunk.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"chunk-0-1.bin, item 0: an array of shape \(1000, "):
        convert(folder, tmp_path / "out", format="litdata")


@pytest.mark.parametrize(("change", "message"), [
    (lambda index: index["chunks"][0].update(filename="../plain/chunk-0-0.bin"), "is not a file name in the folder"),
    (lambda index: index["chunks"][0].update(filename="chunk-9-9.bin"), "is missing"),
    (lambda index: index["chunks"][0].update(chunk_size=3), "holds 2 items, and index.json says 3"),
    (lambda index: index["chunks"][0].update(chunk_size=2**30), "fewer than their offsets take"),
    (lambda index: index["config"]["data_format"].__setitem__(1, "graph"), "the serializer 'graph' is not converted"),
    (lambda index: index["config"]["data_format"].__setitem__(3, "no_header_numpy:14"), "names no dtype"),
    (lambda index: index["config"]["data_format"].pop(), "data_spec has 8 leaves and data_format 7"),
    (lambda index: index["config"].update(encryption="fernet"), "encrypted chunks"),
    (lambda index: index["config"].update(item_loader="TokensLoader"), "convert reads PyTreeLoader"),
    (lambda index: index["config"].update(compression="lz4"), "convert reads uncompressed and zstd chunks"),
    (lambda index: index["config"].update(data_spec="[1, {\"type\": \"builtins.set\", \"context\": null, "
                                          "\"children_spec\": []}]"), "convert rebuilds dicts, lists and tuples"),
], ids=["parent", "missing", "count", "count-past-size", "serializer", "dtype", "leaves", "encrypted", "loader",
        "lz4", "spec"])
def test_a_hostile_index_is_refused(tmp_path, change, message):
    folder = copied(tmp_path)
    edit_index(folder, change)
    with pytest.raises(VarstoreError, match=message):
        convert(folder, tmp_path / "out", format="litdata")
    assert not (tmp_path / "out").exists()


def test_a_whole_file_zstd_chunk_that_inflates_past_its_declared_size_is_refused(tmp_path):
    folder = copied(tmp_path, "zstd-chunk")
    edit_index(folder, lambda index: index["chunks"][4].update(chunk_bytes=100))
    with pytest.raises(VarstoreError, match=r"chunk-0-4.zstd.bin: decompresses to more than the 100 bytes"):
        convert(folder, tmp_path / "out", format="litdata")


def test_a_framed_zstd_chunk_with_a_forged_frame_table_is_refused(tmp_path):
    folder = copied(tmp_path, "zstd-batch")
    chunk = folder / "chunk-0-2.bin"
    data = bytearray(chunk.read_bytes())
    # litdata's LDFZ01 layout: a 24-byte prefix, items + 1 offsets, then 24-byte frame entries.
    items = struct.unpack_from("<I", data, 12)[0]
    second_frame = 24 + 4 * (items + 1) + 24
    first, count, _, length, raw_length = struct.unpack_from("<IIQII", data, second_frame)
    struct.pack_into("<IIQII", data, second_frame, first, count, len(data) - 2, length, raw_length)
    chunk.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"chunk-0-2.bin, frame 1: .* inside the file"):
        convert(folder, tmp_path / "out", format="litdata")


@settings(max_examples=60)
@given(st.data())
def test_any_damage_to_a_chunk_converts_or_is_refused_with_a_varstore_error(tmp_path_factory, data):
    layout = data.draw(st.sampled_from(["plain", "zstd-batch"]))
    folder = copied(tmp_path_factory.mktemp("damaged"), layout)
    chunk = folder / "chunk-0-4.bin"
    damaged = bytearray(chunk.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = damaged[: data.draw(st.integers(len(damaged) // 2, len(damaged)))]
    chunk.write_bytes(bytes(damaged))
    edit_index(folder, lambda index: index["chunks"][4].update(chunk_bytes=len(damaged)))
    try:
        convert(folder, folder / "out", format="litdata")
    except VarstoreError as error:
        assert "chunk-0-4.bin" in str(error)


@pytest.mark.parametrize("workers", [1, 2])
def test_binary_json_and_media_leaves_convert_to_the_values_litdata_was_given(tmp_path, workers):
    index = json.loads((FIXTURES / "media" / "index.json").read_text())
    assert index["config"]["data_format"] == ["json", "video:mp4", "audio:wav", "pdf"]
    assert convert(FIXTURES / "media", tmp_path / "out", format="litdata", workers=workers) == LITDATA_SAMPLES
    store = varstore.open(tmp_path / "out")
    for position in range(LITDATA_SAMPLES):
        assert store[position] == litdata_media_sample(position)


def json_leaf_of_first_item() -> bytes:
    """The json leaf of the media fixture's first item, as litdata's JsonSerializer wrote it."""
    data = (FIXTURES / "media" / "chunk-0-0.bin").read_bytes()
    start = item_start(data, 0)
    size = struct.unpack_from("<I", data, start)[0]
    return data[start + 16 : start + 16 + size]


def test_a_json_leaf_with_bytes_after_its_value_or_cut_short_is_refused():
    leaf = json_leaf_of_first_item()
    assert leaf[0] == 5 and _json_leaf(leaf) == litdata_media_sample(0)[0]  # a dict in the binary nesting
    with pytest.raises(_ItemError, match=r"whose value ends at byte"):
        _json_leaf(leaf + b"\0")
    for cut in (1, 5, len(leaf) // 2, len(leaf) - 1):
        with pytest.raises(_ItemError, match=r"a json leaf"):
            _json_leaf(leaf[:cut])
    # Cut inside the first value's text (tag, key count, key "name", tag, length, 3 of its bytes).
    with pytest.raises(_ItemError, match=r"whose text of 11 bytes at byte 18 runs past its end"):
        _json_leaf(leaf[: 5 + 8 + 5 + 3])


@settings(max_examples=200)
@given(st.data())
def test_any_damage_to_a_json_leaf_decodes_or_is_refused_as_an_item_error(data):
    damaged = bytearray(json_leaf_of_first_item())
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(damaged[: data.draw(st.integers(0, len(damaged)))])
    try:
        _json_leaf(damaged)
    except _ItemError:
        pass
