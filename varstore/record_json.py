"""Records spelled in strict JSON (spec/FORMAT.md §6): for golden vectors and machine-readable dumps.

bytes are ``{"$bytes": "hex"}``; numpy arrays and scalars are
``{"$array": {"dtype": "<u2", "shape": [...], "values": [flat C-order values]}}``
with complex values as [real, imaginary] pairs; a float that is not finite is
``{"$float": "NaN" | "Infinity" | "-Infinity"}``, also among array values; a map
with an integer key is ``{"$map": [[key, value], ...]}`` in its order, since JSON
names are strings ({1: a, "1": b} holds two keys). Every spelling parses with a
strict JSON parser; everything else is JSON as is.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .codecs import canonical_dtype

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float_to_json(value: float) -> Any:
    if math.isfinite(value):
        return value
    return {"$float": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}


def _array_value_to_json(value: Any) -> Any:
    if isinstance(value, complex):
        return [_float_to_json(value.real), _float_to_json(value.imag)]
    return _float_to_json(value) if isinstance(value, float) else value


def to_json(record: Any) -> Any:
    """The strict-JSON spelling of a decoded record."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        return {"$bytes": bytes(record).hex()}
    if isinstance(record, (np.ndarray, np.generic)):
        array = np.asarray(record)
        values = [_array_value_to_json(value) for value in array.reshape(-1).tolist()]
        return {"$array": {"dtype": canonical_dtype(array.dtype).str, "shape": list(array.shape), "values": values}}
    if isinstance(record, dict):
        if all(isinstance(key, str) for key in record):
            return {key: to_json(value) for key, value in record.items()}
        return {"$map": [[key, to_json(value)] for key, value in record.items()]}
    if isinstance(record, (list, tuple)):
        return [to_json(value) for value in record]
    if isinstance(record, float):
        return _float_to_json(record)
    return record


def _float_from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$float"}:
        if value["$float"] not in _NON_FINITE:
            raise ValueError(f'"$float" must be "NaN", "Infinity" or "-Infinity", not {value["$float"]!r}')
        return _NON_FINITE[value["$float"]]
    return value


def from_json(value: Any) -> Any:
    """The record a JSON spelling stands for (the inverse of `to_json`)."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        if set(value) == {"$float"}:
            return _float_from_json(value)
        if set(value) == {"$map"}:
            return {key: from_json(item) for key, item in value["$map"]}
        if set(value) == {"$array"}:
            spec = value["$array"]
            dtype = canonical_dtype(spec["dtype"])
            if dtype.kind == "c":
                values = [complex(_float_from_json(real), _float_from_json(imaginary)) for real, imaginary in spec["values"]]
            else:
                values = [_float_from_json(item) for item in spec["values"]]
            return np.array(values, dtype=dtype).reshape(spec["shape"])
        return {key: from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json(item) for item in value]
    return value
