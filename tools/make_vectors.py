"""Regenerate the golden vectors in spec/vectors/: ``python tools/make_vectors.py``.

Each vector is a shard (NAME.data, NAME.index) plus NAME.json, which describes
the writer's inputs and the expected records in plain JSON (the spelling is in
spec/FORMAT.md §6). Run this only when the format changes, in the same commit
as the spec.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import varstore  # noqa: E402
from varstore.record_json import to_json  # noqa: E402

VECTORS = ROOT / "spec" / "vectors"

_SAMPLE_IMAGE = bytes(range(0, 256, 5))


def _vectors() -> dict[str, dict[str, Any]]:
    return {
        "bytes-basic": {
            "codec": "bytes",
            "metadata": {"source": "golden vector", "licence": "CC0"},
            "records": [b"", b"hello", bytes(range(256)), bytes(10)],
        },
        "bytes-without-checksums": {
            "codec": "bytes",
            "checksums": False,
            "records": [b"one", b"", b"three\n"],
        },
        "empty": {"codec": "bytes", "records": []},
        "str-utf8": {"codec": "str", "records": ["", "ascii", "naïve café", "日本語のテキスト", "emoji \U0001f642"]},
        "ndarray-uint16-tokens": {
            "codec": "ndarray",
            "dtype": "uint16",
            "metadata": {"tokenizer": "example-bpe", "eos": 0},
            "records": [np.array(values, np.uint16) for values in ([1, 2, 3], [], [65535, 0], [42])],
        },
        "ndarray-float16-frames": {
            "codec": "ndarray",
            "dtype": "float16",
            "shape": [4],
            "records": [
                np.array([[0.5, 1.25, -2.0, 0.0], [3.0, -0.125, 1024.0, 0.75]], np.float16),
                np.zeros((0, 4), np.float16),
                np.array([[-1.0, 2.5, 65504.0, -65504.0]], np.float16),
            ],
        },
        "msgpack-samples": {
            "codec": "msgpack",
            "metadata": {"fields": ["image", "label", "caption"]},
            "records": [
                {
                    "image": _SAMPLE_IMAGE,
                    "label": 3,
                    "caption": "a cat on a mat",
                    "score": 0.5,
                    "flags": [True, False, None],
                    "mask": np.arange(6, dtype=np.int32).reshape(2, 3),
                },
                {"tokens": np.array([7, 8, 9], np.uint16), "weight": np.float32(0.25), "nested": {"depth": [1, [2, [3]]]}},
                {},
            ],
        },
    }


def write_vector(prefix: str, description: dict[str, Any]) -> None:
    options = {key: description[key] for key in ("codec", "dtype", "shape", "metadata", "checksums") if key in description}
    with varstore.Writer(prefix, overwrite=True, **options) as writer:
        writer.extend(description["records"])


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, description in _vectors().items():
        prefix = str(VECTORS / name)
        write_vector(prefix, description)
        reader = varstore.open(prefix)
        header = reader.header
        document = {
            "codec": reader.codec,
            "codec_params": reader._codec.params(),
            "metadata": reader.metadata,
            "record_checksums": header.has_record_checksums,
            "format_version": [varstore.format.MAJOR_VERSION, header.minor_version],
            "record_count": header.record_count,
            "data_size": header.data_size,
            "data_crc32c": header.data_crc32c,
            "records": [to_json(record) for record in description["records"]],
        }
        with open(prefix + ".json", "w", encoding="utf-8") as file:
            json.dump(document, file, indent=1, ensure_ascii=False, allow_nan=False)  # strict JSON (§6)
            file.write("\n")
        print(f"{name}: {header.record_count} records, {os.path.getsize(prefix + '.index')} index bytes, {header.data_size} data bytes")


if __name__ == "__main__":
    main()
