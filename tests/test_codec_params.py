"""Codec parameters are exact (spec §2): `bytes`, `str` and `msgpack` take exactly `{}`, `ndarray` exactly
`"dtype"` and `"shape"`. A missing or unknown member is refused at open, naming the file and the member, so a
flipped byte in `"shape"` can no longer turn rows of `<u2` x 3 into 1-D records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import varstore
from varstore.format import header as fmt
from varstore.format.codecs import CODEC_NAMES, codec_from_stored
from varstore.format.manifest import MANIFEST_NAME

from .helpers_reliability import read_shard_files, with_metadata, write_shard_files

PARAM_NAMES = {"bytes": set(), "str": set(), "msgpack": set(), "ndarray": {"dtype", "shape"}}
VALID_VALUES = {"dtype": "<u2", "shape": [3], "user": {}, "Shape": [3], "": 0}


def shard_with_codec_params(tmp_path, codec: str, params: dict) -> str:
    """A shard of `codec` whose metadata's "codec" object is `params`, every size and CRC consistent."""
    options = {"dtype": "<u2", "shape": (3,)} if codec == "ndarray" else {}
    record = {"bytes": b"abcdef", "str": "abcdef", "msgpack": [1, 2], "ndarray": np.arange(6, dtype="<u2").reshape(2, 3)}[codec]
    with varstore.Writer(tmp_path / "written", codec=codec, **options) as writer:
        writer.append(record)
    index, data = read_shard_files(tmp_path / "written")
    forged = with_metadata(index, json.dumps({"codec": params, "user": {}}, separators=(",", ":")).encode())
    write_shard_files(tmp_path / "forged", forged, data)
    return str(tmp_path / "forged")


@pytest.mark.parametrize(("codec", "params", "member"), [
    ("ndarray", {"dtype": "<u2"}, "lack the member 'shape'"),
    ("ndarray", {"shape": [3]}, "lack the member 'dtype'"),
    ("ndarray", {"dtype": "<u2", "shape": [3], "order": "C"}, "unknown member 'order'"),
    ("ndarray", {"dtype": "<u2", "shape": [3], "Shape": [3]}, "unknown member 'Shape'"),
    ("bytes", {"dtype": "<u2", "shape": [3]}, "unknown member 'dtype'"),
    ("bytes", {"shape": []}, "unknown member 'shape'"),
    ("str", {"encoding": "utf-8"}, "unknown member 'encoding'"),
    ("msgpack", {"": 0}, "unknown member ''"),
], ids=lambda value: json.dumps(value) if isinstance(value, dict) else value)
def test_shard_whose_codec_parameters_are_not_exactly_its_codecs_is_refused_at_open(tmp_path, codec, params, member):
    path = shard_with_codec_params(tmp_path, codec, params)
    with pytest.raises(varstore.FormatError, match=member) as caught:
        varstore.open(path)
    assert caught.value.path == fmt.shard_paths(path)[1]


def test_shard_whose_exact_codec_parameters_are_rewritten_the_same_opens(tmp_path):
    """The forging above changes nothing else: the same metadata, spelled the writer's way, opens and reads."""
    path = shard_with_codec_params(tmp_path, "ndarray", {"dtype": "<u2", "shape": [3]})
    with varstore.open(path) as reader:
        reader.verify()
        assert reader[0].shape == (2, 3)


@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
def test_ndarray_writer_always_stores_both_dtype_and_shape(tmp_path, shape):
    with varstore.Writer(tmp_path / "arrays", codec="ndarray", dtype="uint16", shape=shape) as writer:
        writer.append(np.zeros((1, *shape), np.uint16))
    index, _ = read_shard_files(tmp_path / "arrays")
    metadata = index[fmt.HEADER_SIZE : fmt.HEADER_SIZE + int.from_bytes(index[32:40], "little")]
    assert json.loads(metadata)["codec"] == {"dtype": "<u2", "shape": list(shape)}
    with varstore.ShardedWriter(tmp_path / "dataset", codec="ndarray", dtype="uint16", shape=shape) as writer:
        writer.append(np.zeros((1, *shape), np.uint16))
    manifest = json.loads((tmp_path / "dataset" / MANIFEST_NAME).read_bytes())
    assert manifest["codec"] == {"name": "ndarray", "params": {"dtype": "<u2", "shape": list(shape)}}


def dataset_with_codec(tmp_path, name: str, params: dict) -> str:
    """An ndarray dataset whose manifest's "codec" is rewritten, without its "crc32c" (as a 1.0 writer's)."""
    with varstore.ShardedWriter(tmp_path, codec="ndarray", dtype="uint16", shape=(3,)) as writer:
        writer.append(np.zeros((2, 3), np.uint16))
    document = json.loads((tmp_path / MANIFEST_NAME).read_bytes())
    document.pop("crc32c", None)
    document["codec"] = {"name": name, "params": params}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(document))
    return str(tmp_path)


@pytest.mark.parametrize(("name", "params", "member"), [
    ("ndarray", {"dtype": "<u2"}, "lack the member 'shape'"),
    ("ndarray", {"dtype": "<u2", "shape": [3], "x": 1}, "unknown member 'x'"),
    ("bytes", {"dtype": "<u2", "shape": [3]}, "unknown member 'dtype'"),
])
def test_manifest_whose_codec_parameters_are_not_exactly_its_codecs_is_refused_at_open(tmp_path, name, params, member):
    path = dataset_with_codec(tmp_path, name, params)
    with pytest.raises(varstore.FormatError, match=member) as caught:
        varstore.open(path)
    assert caught.value.path in (path, f"{path}/{MANIFEST_NAME}")


stored_params = st.dictionaries(st.sampled_from(sorted(VALID_VALUES)), st.none(), max_size=4).map(
    lambda names: {name: VALID_VALUES[name] for name in names}
)


@given(codec=st.sampled_from(CODEC_NAMES), params=stored_params)
def test_stored_parameters_are_accepted_exactly_when_their_members_are_the_codecs(codec, params):
    if set(params) == PARAM_NAMES[codec]:
        assert codec_from_stored(codec, params, path="shard.index").params() == (params or {})
    else:
        with pytest.raises(varstore.FormatError, match=r"shard\.index: \w+ codec parameters (lack the|have the unknown) member"):
            codec_from_stored(codec, params, path="shard.index")
