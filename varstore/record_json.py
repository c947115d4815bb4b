"""Records spelled in plain JSON (spec/FORMAT.md §6): for golden vectors and machine-readable dumps.

bytes are ``{"$bytes": "hex"}``; numpy arrays and scalars are
``{"$array": {"dtype": "<u2", "shape": [...], "values": [flat C-order values]}}``
with complex values as [real, imaginary] pairs; everything else is JSON as is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .codecs import canonical_dtype


def to_json(record: Any) -> Any:
    """The JSON-compatible spelling of a decoded record."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        return {"$bytes": bytes(record).hex()}
    if isinstance(record, (np.ndarray, np.generic)):
        array = np.asarray(record)
        flat = array.reshape(-1)
        values = [[value.real, value.imag] for value in flat.tolist()] if array.dtype.kind == "c" else flat.tolist()
        return {"$array": {"dtype": canonical_dtype(array.dtype).str, "shape": list(array.shape), "values": values}}
    if isinstance(record, dict):
        return {str(key): to_json(value) for key, value in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_json(value) for value in record]
    return record


def from_json(value: Any) -> Any:
    """The record a JSON spelling stands for (the inverse of `to_json`)."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        if set(value) == {"$array"}:
            spec = value["$array"]
            dtype = canonical_dtype(spec["dtype"])
            values = [complex(*pair) for pair in spec["values"]] if dtype.kind == "c" else spec["values"]
            return np.array(values, dtype=dtype).reshape(spec["shape"])
        return {key: from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json(item) for item in value]
    return value
