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


MDS_IMAGE_SAMPLES = 14
MDS_IMAGE_COLUMNS = {"raw": "pil", "raws": "list[pil]", "pngs": "list[png]", "jpegs": "list[jpeg]",
                     "encoded": "jpeg_array"}
# The raw image modes of the MDS image fixture: their pixels' numpy dtype and channels (None: one, no axis).
RAW_MODES = {"RGB": (np.uint8, 3), "L": (np.uint8, None), "RGBA": (np.uint8, 4), "LA": (np.uint8, 2),
             "P": (np.uint8, None), "I;16": (np.dtype("<u2"), None), "1": (np.bool_, None)}


def raw_pixels(index: int) -> tuple[str, np.ndarray]:
    """(mode, pixels as numpy reads that image) of raw image `index`: every mode in turn, widths across a byte of
    mode "1" pixels."""
    mode = list(RAW_MODES)[index % len(RAW_MODES)]
    dtype, channels = RAW_MODES[mode]
    shape = (2 + index % 3, 3 + index % 4 * 3) + ((channels,) if channels else ())
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * (index + 7)
    return mode, (values % 2 == 1 if dtype is np.bool_ else values % np.iinfo(dtype).max).astype(dtype)


def raw_image(index: int) -> Image.Image:
    """Raw image `index` as a PIL image made from its pixels' bytes (mode "1" packs 8 pixels a byte, rows padded)."""
    mode, values = raw_pixels(index)
    data = np.packbits(values, axis=1).tobytes() if mode == "1" else values.tobytes()
    return Image.frombytes(mode, (values.shape[1], values.shape[0]), data)


def solid_colour(index: int, position: int) -> tuple[int, int, int]:
    """The colour of image `position` of a list in sample `index`: JPEG keeps one-colour images nearly exactly."""
    return (index * 13 + position * 50) % 256, 100, 255 - index


def jpeg_of(colour: tuple[int, int, int]) -> bytes:
    encoded = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(encoded, "JPEG")
    return encoded.getvalue()


def mds_image_sample(index: int) -> dict[str, Any]:
    """Sample `index` of the MDS image fixture as MDSWriter is given it (jpeg_array takes encoded JPEGs)."""
    return {
        "raw": raw_image(index),
        "raws": [raw_image(index + position) for position in range(index % 3)],
        "pngs": [picture(index + position) for position in range(index % 3 + 1)],
        "jpegs": [Image.new("RGB", (8, 8), solid_colour(index, position)) for position in range(index % 3)],
        "encoded": [jpeg_of(solid_colour(index, position)) for position in range(index % 2 + 1)],
    }


def litdata_json_value(index: int) -> dict[str, Any]:
    """A dict for litdata's JsonSerializer (as a JsonLeaf) whose binary nesting takes every tag: each kind of value,
    lists of strings, integers, floats and booleans, records of the same keys, a list of mixed values (kept as
    JSON text) and nested dicts."""
    return {"name": f"sample {index} ø", "turns": [f"turn {turn} of {index}" for turn in range(index % 4)],
            "ids": [index, -(2**40), 2**62][: index % 3 + 1], "scores": [0.5, index / 3], "flags": [True, index % 2 == 0],
            "rows": [{"id": row, "text": f"answer {row}", "score": row / 4, "gold": row % 2 == 0, "note": None}
                     for row in range(index % 3 + 1)],
            "none": None, "ok": index % 4 == 0, "count": index * 7, "ratio": index / 8,
            "nested": {"deep": {"index": index, "label": f"x{index}", "part": index / 5, "odd": index % 2 == 1,
                                "none": None}}, "mixed": [index, "two", None]}


def litdata_media_sample(index: int) -> list[Any]:
    """Sample `index` of the litdata fixture of binary JSON and file bytes, as a list (a dict sample's writer would
    split the JSON value's dicts into leaves of their own): the JSON value, then the bytes of a clip, a sound and
    a document, given to litdata's Video, Audio and File (not real media: litdata stores the bytes as they are)."""
    return [litdata_json_value(index), b"\0\0\0\x18ftypmp42" + bytes([index]) * index,
            b"RIFF" + index.to_bytes(4, "little") + b"WAVEfmt ", b"%PDF-1.4 page " + str(index).encode()]
