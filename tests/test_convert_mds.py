"""MosaicML MDS folders into varstore: the folders under tests/data/mds/ were written by MDS's own MDSWriter
(tools/make_peer_fixtures.py); every record must equal the sample given to it, and damaged or hostile folders
are refused with the shard file and sample named."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore
from tests.peer_samples import MDS_COLUMNS, MDS_SAMPLES, PICKLE_SAMPLES, mds_sample, pickle_sample, pixels
from varstore.conversion import convert
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
    (lambda shards: shards[0]["column_encodings"].__setitem__(0, "pil"), "is not converted"),
    (lambda shards: shards[0]["column_sizes"].__setitem__(0, 4), "column_sizes says 4"),
    (lambda shards: shards[0].update(format="json"), "convert reads MDS shards of version 2"),
    (lambda shards: shards[0].update(compression="br:5", zip_data={"basename": "x", "bytes": 1}),
     "brotli and snappy are not read"),
], ids=["parent", "absolute", "missing", "count-past-size", "count-wrong", "encoding", "pil", "size", "format", "brotli"])
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
