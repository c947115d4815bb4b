"""MosaicML MDS folders into varstore: the folders under tests/data/mds/ were written by MDS's own MDSWriter
(tools/make_peer_fixtures.py); every record must equal the sample given to it, and damaged or hostile folders
are refused with the shard file and sample named."""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from PIL import Image
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from tests.peer_samples import (
    MDS_COLUMNS,
    MDS_IMAGE_COLUMNS,
    MDS_IMAGE_SAMPLES,
    MDS_SAMPLES,
    PICKLE_SAMPLES,
    RAW_MODES,
    mds_image_sample,
    mds_sample,
    pickle_sample,
    pixels,
    raw_pixels,
    solid_colour,
)
from varstore.conversion import convert
from varstore.conversion.raw_images import RawImageError, png_of_raw_pixels
from varstore.errors import VarstoreError

FIXTURES = Path(__file__).parent / "data" / "mds"


def expected_value(value):
    """A sample's value as the converted record holds it (numpy scalars as numbers, images as their pixels)."""
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "getpixel"):
        return np.asarray(value.convert("RGB")).tolist()
    return value


def assert_sample(record: dict, sample: dict) -> None:
    assert sorted(record) == sorted(MDS_COLUMNS)
    for name, value in sample.items():
        found = record[name]
        if isinstance(value, np.ndarray):
            assert isinstance(found, np.ndarray) and found.dtype == value.dtype and found.shape == value.shape
            assert np.array_equal(found, value)
        elif name == "picture":
            assert pixels(found) == expected_value(value)
        else:
            assert found == expected_value(value) and type(found) is type(expected_value(value)), name


@pytest.mark.parametrize("folder", ["plain", "zstd", "gzip"])
@pytest.mark.parametrize("workers", [1, 3])
def test_mdswriter_folders_convert_to_the_samples_it_was_given(tmp_path, folder, workers):
    assert len(json.loads((FIXTURES / folder / "index.json").read_text())["shards"]) > 3  # parts cross shards
    written = convert(FIXTURES / folder, tmp_path / "out", format="mds", workers=workers)
    store = varstore.open(tmp_path / "out")
    assert written == len(store) == MDS_SAMPLES
    for index in range(MDS_SAMPLES):
        assert_sample(store[index], mds_sample(index))


def test_pickle_columns_are_refused_unless_allowed(tmp_path):
    with pytest.raises(VarstoreError, match=r"column 'obj': a pkl column; unpickling runs whatever code"):
        convert(FIXTURES / "pickle", tmp_path / "out", format="mds")
    assert not (tmp_path / "out").exists()
    assert convert(FIXTURES / "pickle", tmp_path / "out", format="mds", allow_pickle=True) == PICKLE_SAMPLES
    assert list(varstore.open(tmp_path / "out")) == [pickle_sample(index) for index in range(PICKLE_SAMPLES)]


def test_the_cli_takes_allow_pickle(tmp_path):
    command = [sys.executable, "-m", "varstore", "convert", str(FIXTURES / "pickle"), str(tmp_path / "out"),
               "--format", "mds", "--quiet"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1 and "--allow-pickle" in refused.stderr
    allowed = subprocess.run([*command, "--allow-pickle"], capture_output=True, text=True, timeout=120, check=False)
    assert allowed.returncode == 0, allowed.stderr
    assert f"wrote {PICKLE_SAMPLES} records" in allowed.stdout


def copied(tmp_path: Path, folder: str = "plain") -> Path:
    target = tmp_path / folder
    shutil.copytree(FIXTURES / folder, target)
    return target


def edit_index(folder: Path, change) -> None:
    index = json.loads((folder / "index.json").read_text())
    change(index["shards"])
    (folder / "index.json").write_text(json.dumps(index))


def sample_bounds(shard: bytes, position: int) -> tuple[int, int]:
    """Where sample `position` of a raw MDS shard starts and ends, read from its offsets as MDS's reader reads them."""
    return struct.unpack_from("<II", shard, 4 + 4 * position)


def test_a_truncated_shard_is_refused_naming_it(tmp_path):
    folder = copied(tmp_path)
    shard = folder / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(VarstoreError, match=r"shard.00001.mds: .* bytes, and index.json says"):
        convert(folder, tmp_path / "out", format="mds")
    # Its size declared to match, the offsets still run past its end.
    edit_index(folder, lambda shards: shards[1]["raw_data"].update(bytes=shard.stat().st_size))
    with pytest.raises(VarstoreError, match=r"shard.00001.mds: its sample offsets"):
        convert(folder, tmp_path / "out", format="mds")
    assert not (tmp_path / "out").exists()


def test_a_sample_whose_sizes_disagree_with_its_bytes_is_refused_naming_shard_and_sample(tmp_path):
    folder = copied(tmp_path)
    shard = folder / "shard.00002.mds"
    data = bytearray(shard.read_bytes())
    start, _ = sample_bounds(data, 3)
    (size,) = struct.unpack_from("<I", data, start)  # the first variable column's size
    struct.pack_into("<I", data, start, size + 1)
    shard.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"shard.00002.mds, sample 3: its columns' sizes"):
        convert(folder, tmp_path / "out", format="mds")


def test_an_ndarray_with_an_unknown_dtype_code_is_refused_with_its_sample(tmp_path):
    folder = copied(tmp_path)
    names = json.loads((folder / "index.json").read_text())["shards"][0]["column_names"]
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    start, _ = sample_bounds(data, 1)
    # The dynamic "tokens" column: skip the variable sizes and every column before it.
    sizes = [MDS_COLUMNS[name] for name in names]
    fixed = {"int": 8, "int8": 1, "uint16": 2, "int32": 4, "int64": 8, "uint64": 8, "float16": 2, "float32": 4,
             "float64": 8, "ndarray:int16:2,3": 12}
    variable = [name for name, encoding in zip(names, sizes) if encoding not in fixed]
    lengths = dict(zip(variable, struct.unpack_from(f"<{len(variable)}I", data, start)))
    at = start + 4 * len(variable)
    for name in names[: names.index("tokens")]:
        at += fixed.get(MDS_COLUMNS[name], lengths.get(name, 0))
    data[at] = 77  # not one of MDS's ndarray dtype codes
    shard.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"shard.00000.mds, sample 1: column 'tokens': an ndarray whose dtype code 77"):
        convert(folder, tmp_path / "out", format="mds")


@pytest.mark.parametrize(("change", "message"), [
    (lambda shards: shards[0]["raw_data"].update(basename="../plain/shard.00000.mds"), "lies outside"),
    (lambda shards: shards[0]["raw_data"].update(basename="/etc/passwd"), "lies outside"),
    (lambda shards: shards[0]["raw_data"].update(basename="gone.mds"), "is missing"),
    (lambda shards: shards[0].update(samples=2**31), "fewer than their offsets take"),
    (lambda shards: shards[0].update(samples=4), "holds 5 samples, and index.json says 4"),
    (lambda shards: shards[0]["column_encodings"].__setitem__(0, "complex128"), "not an MDS column encoding"),
    (lambda shards: shards[0]["column_sizes"].__setitem__(0, 4), "column_sizes says 4"),
    (lambda shards: shards[0].update(format="json"), "convert reads MDS shards of version 2"),
    (lambda shards: shards[0].update(compression="br:5", zip_data={"basename": "x", "bytes": 1}),
     "brotli and snappy are not read"),
], ids=["parent", "absolute", "missing", "count-past-size", "count-wrong", "encoding", "size", "format", "brotli"])
def test_a_hostile_index_is_refused(tmp_path, change, message):
    folder = copied(tmp_path)
    edit_index(folder, change)
    with pytest.raises(VarstoreError, match=message):
        convert(folder, tmp_path / "out", format="mds")
    assert not (tmp_path / "out").exists()


def test_a_compressed_shard_that_inflates_past_its_declared_size_is_refused(tmp_path):
    folder = copied(tmp_path, "zstd")
    edit_index(folder, lambda shards: shards[2]["raw_data"].update(bytes=100))
    with pytest.raises(VarstoreError, match=r"shard.00002.mds.zstd: decompresses to more than the 100 bytes"):
        convert(folder, tmp_path / "out", format="mds")
    shard = folder / "shard.00002.mds.zstd"
    shard.write_bytes(zstandard.ZstdCompressor().compress(b"\0" * 10) [:-3])
    edit_index(folder, lambda shards: shards[2]["zip_data"].update(bytes=shard.stat().st_size))
    with pytest.raises(VarstoreError, match=r"shard.00002.mds.zstd: (not a whole zstd stream|decompresses to)"):
        convert(folder, tmp_path / "out", format="mds")


@settings(max_examples=60)
@given(st.data())
def test_any_damage_to_a_shard_converts_or_is_refused_with_a_varstore_error(tmp_path_factory, data):
    folder = copied(tmp_path_factory.mktemp("damaged"))
    shard = folder / "shard.00003.mds"
    original = shard.read_bytes()
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = damaged[: data.draw(st.integers(len(damaged) // 2, len(damaged)))]
    shard.write_bytes(bytes(damaged))
    edit_index(folder, lambda shards: shards[3]["raw_data"].update(bytes=len(damaged)))
    try:
        convert(folder, folder / "out", format="mds")
    except VarstoreError as error:
        assert "shard.00003.mds" in str(error)


def decoded(png: bytes) -> np.ndarray:
    assert png.startswith(b"\x89PNG")
    return np.asarray(Image.open(io.BytesIO(png)))


def assert_close_to_colour(jpeg: bytes, colour: tuple[int, int, int]) -> None:
    """A JPEG of one colour, decoded within 3 of it (JPEG is lossy; the fixture's images are one colour)."""
    assert jpeg.startswith(b"\xff\xd8")
    found = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.int16)
    assert found.shape == (8, 8, 3) and np.abs(found - np.array(colour, dtype=np.int16)).max() <= 3


def test_mds_raw_images_become_png_of_their_pixels_and_image_lists_lists_of_images(tmp_path):
    assert len(json.loads((FIXTURES / "images" / "index.json").read_text())["shards"]) > 3
    assert convert(FIXTURES / "images", tmp_path / "out", format="mds", workers=2) == MDS_IMAGE_SAMPLES
    store = varstore.open(tmp_path / "out")
    for index in range(MDS_IMAGE_SAMPLES):
        record, sample = store[index], mds_image_sample(index)
        assert sorted(record) == sorted(MDS_IMAGE_COLUMNS)
        found = decoded(record["raw"])  # raw pixels in MDS, PNG in varstore: the same pixels, dtype and shape
        expected = raw_pixels(index)[1]
        assert found.dtype == expected.dtype and np.array_equal(found, expected), raw_pixels(index)[0]
        assert [decoded(png).tolist() for png in record["raws"]] == [raw_pixels(index + k)[1].tolist()
                                                                     for k in range(index % 3)]
        assert [pixels(png) for png in record["pngs"]] == [np.asarray(image).tolist() for image in sample["pngs"]]
        assert len(record["jpegs"]) == index % 3 and len(record["encoded"]) == index % 2 + 1
        for position, jpeg in enumerate(record["jpegs"]):
            assert_close_to_colour(jpeg, solid_colour(index, position))
        for position, jpeg in enumerate(record["encoded"]):
            assert_close_to_colour(jpeg, solid_colour(index, position))


def image_column_start(data: bytes, sample: int, column: str) -> int:
    """Where `column` of `sample` starts in a raw shard of the image fixture (every column is of varying size)."""
    names = sorted(MDS_IMAGE_COLUMNS)
    start, _ = sample_bounds(data, sample)
    sizes = struct.unpack_from(f"<{len(names)}I", data, start)
    return start + 4 * len(names) + sum(sizes[: names.index(column)])


@pytest.mark.parametrize(("column", "field", "message"), [
    ("raw", 0, r"column 'raw': a raw \S+ image of \d+x\d+ needs [\d,]+ bytes of pixels"),
    ("raw", 8, r"column 'raw': a raw image whose mode name of"),
    ("raws", 4, r"column 'raws': a list of \S+ pil images whose sizes run past"),
    ("raws", 0, r"column 'raws': a list of pil images whose reserved first word"),
    ("encoded", 4, r"column 'encoded': a list of 2 jpeg images of [\d,]+ bytes after its header"),
], ids=["pixels", "mode", "list-count", "list-reserved", "jpeg-array-size"])
def test_a_raw_image_or_image_list_whose_sizes_disagree_is_refused_naming_the_sample(tmp_path, column, field, message):
    folder = copied(tmp_path, "images")
    shard = folder / "shard.00001.mds"
    data = bytearray(shard.read_bytes())
    at = image_column_start(data, 0, column) + field
    (value,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at, value + 1000)
    shard.write_bytes(bytes(data))
    with pytest.raises(VarstoreError, match=r"shard.00001.mds, sample 0: " + message):
        convert(folder, tmp_path / "out", format="mds")
    assert not (tmp_path / "out").exists()


@settings(max_examples=80)
@given(mode=st.sampled_from(sorted(RAW_MODES)), width=st.integers(1, 20), height=st.integers(1, 5), data=st.data())
def test_a_raw_image_of_any_mode_and_size_becomes_png_of_exactly_its_pixels(mode, width, height, data):
    row = (width + 7) // 8 if mode == "1" else width * len(Image.new(mode, (1, 1)).tobytes())
    pixel_bytes = data.draw(st.binary(min_size=row * height, max_size=row * height))
    header = struct.pack("<III", width, height, len(mode)) + mode.encode()
    found = Image.open(io.BytesIO(png_of_raw_pixels(header + pixel_bytes, "mds")))
    assert found.size == (width, height)
    assert found.tobytes() == Image.frombytes(mode, (width, height), pixel_bytes).tobytes()
    # One byte more or fewer of pixels is refused, not read past or padded.
    for wrong in (pixel_bytes[:-1], pixel_bytes + b"\0"):
        with pytest.raises(RawImageError, match="bytes of pixels"):
            png_of_raw_pixels(header + wrong, "mds")
