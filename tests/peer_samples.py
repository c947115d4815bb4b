"""The samples the peer fixtures under tests/data/ hold, computed from their index alone: tools/make_peer_fixtures.py
hands them to the peer libraries' own writers (MosaicML's MDSWriter, litdata's optimize) and the tests compare
varstore's conversion of those files with these values, computed again here rather than read back from the files."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

MDS_SAMPLES = 23
MDS_COLUMNS = {
    "blob": "bytes", "text": "str", "count": "int", "small": "int8", "port": "uint16", "offset": "int32",
    "big": "int64", "huge": "uint64", "half": "float16", "single": "float32", "double": "float64",
    "tokens": "ndarray", "grid": "ndarray:int16:2,3", "vector": "ndarray:float32", "meta": "json",
    "number": "str_int", "picture": "png",
}  # fmt: skip
_ARRAY_DTYPES = (np.uint8, np.int16, np.float32, np.int64)


def picture(index: int) -> Image.Image:
    """A small RGB image that differs with `index`."""
    pixels = (np.arange(3 * 4 * 3, dtype=np.uint16).reshape(3, 4, 3) * (index + 1) % 256).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def pixels(encoded: bytes) -> list[Any]:
    """The pixels of an encoded image, to compare images whatever their encoder."""
    return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB")).tolist()


def mds_sample(index: int) -> dict[str, Any]:
    """Sample `index` as MDSWriter is given it (the png column as a PIL image)."""
    return {
        "blob": bytes([index % 256]) * (index % 5),
        "text": f"sample {index} ü" * (index % 3),
        "count": (-1) ** index * index * 10**12,
        "small": np.int8(-index),
        "port": np.uint16(60000 + index),
        "offset": np.int32(-(2**31) + index),
        "big": np.int64(2**62 + index),
        "huge": np.uint64(2**64 - 1 - index),
        "half": np.float16(index / 8),
        "single": np.float32(index / 3),
        "double": np.float64(index / 7),
        "tokens": np.arange(2 * (index % 3 + 1), dtype=_ARRAY_DTYPES[index % 4]).reshape(index % 3 + 1, 2),
        "grid": np.arange(6, dtype=np.int16).reshape(2, 3) * index,
        "vector": np.linspace(0, 1, index % 4 + 1, dtype=np.float32),
        "meta": {"index": index, "tags": ["a"] * (index % 3), "nested": {"ok": index % 2 == 0}},
        "number": index * 1001,
        "picture": picture(index),
    }


PICKLE_SAMPLES = 5


def pickle_sample(index: int) -> dict[str, Any]:
    """Sample `index` of the fixture with a pkl column (a value only pickle would store in MDS)."""
    return {"id": index, "obj": {"index": index, "pair": [index, str(index)]}}


LITDATA_SAMPLES = 17


def litdata_sample(index: int) -> dict[str, Any]:
    """Sample `index` as litdata's writer is given it: a dict of the leaf types its serializers handle."""
    return {
        "index": index,
        "text": f"litdata {index} ø" * (index % 3),
        "score": index / 4,
        "tokens": np.arange(index % 5 + 1, dtype=np.int32) * index,
        "matrix": np.full((2, index % 3 + 1), index, dtype=np.float64),
        "raw": bytes([index % 256, 255 - index % 256]) * (index % 4),
        "picture": picture(index),
        # Given to litdata as a JPEG file, which it stores as it is; of one colour, which JPEG keeps nearly exactly.
        "photo": Image.new("RGB", (8, 8), (index * 13 % 256, 100, 255 - index)),
    }


def litdata_pickle_sample(index: int) -> list[Any]:
    """Sample `index` of the litdata fixture with a pickle leaf (a bytearray: no other serializer takes it); a list,
    which litdata keeps as pytree items (dict samples of plain leaves it keeps as Arrow rows)."""
    return [index, bytearray(b"pickled") * index]


def litdata_text_sample(index: int) -> dict[str, Any]:
    """Sample `index` of a text corpus as litdata's writer is given it (plain leaves, which it keeps as Arrow rows)."""
    return {"index": index, "text": f"document {index}" * (index % 4), "tokens": list(range(index % 6)),
            "score": index / 8}
