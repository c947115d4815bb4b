"""Records spelled in strict JSON, the notation of spec/FORMAT.md §6.1: golden vectors and `varstore dump --json`.

null, true, false, strings and arrays are themselves; a number written without fraction or exponent is an
integer (in msgpack's range), any other a float (`to_json` keeps floats floats, so 1.0 prints as ``1.0``). Four one-member objects
spell what JSON lacks: ``{"$bytes": "lowercase hex"}``, ``{"$float": "NaN" | "Infinity" | "-Infinity"}``,
``{"$array": {"dtype": D, "shape": [...], "values": [flat, C order]}}`` and ``{"$map": [[key, value], ...]}``.
A map is a plain object only when all its keys are str and none starts with "$"; otherwise it is a ``$map``,
so each spelling has one meaning and each record one spelling. `from_json` refuses every other object whose
member names start with "$", with a ValueError naming it. NaN is the quiet NaN: a NaN's sign and payload
are not spelled.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np

from .codecs import ALLOWED_DTYPES, canonical_dtype

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_LOWERCASE_HEX = re.compile("(?:[0-9a-f]{2})*")
_ARRAY_MEMBERS = {"dtype", "shape", "values"}
_SHOWN_CHARACTERS = 100
_MIN_INTEGER, _INTEGER_BOUND = -(1 << 63), 1 << 64


# -- to_json ----------------------------------------------------------------------------------------------


def _float_to_json(value: float) -> Any:
    if math.isfinite(value):
        return float(value)  # a numpy float64 becomes a plain float
    return {"$float": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}


def _array_to_json(array: np.ndarray) -> dict[str, Any]:
    dtype = canonical_dtype(array.dtype)
    flat = array.reshape(-1).tolist()
    if dtype.kind == "c":
        values = [[_float_to_json(value.real), _float_to_json(value.imag)] for value in flat]
    elif dtype.kind == "f":
        values = [_float_to_json(value) for value in flat]
    else:
        values = flat
    return {"$array": {"dtype": dtype.str, "shape": list(array.shape), "values": values}}


def _is_plain_name(key: Any) -> bool:
    return isinstance(key, str) and not key.startswith("$")


def _key_to_json(key: Any) -> str | int:
    if isinstance(key, str):
        return str(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return int(key)
    raise TypeError(f"the notation spells map keys that are str or int, not {key!r} ({type(key).__name__})")


def to_json(record: Any) -> Any:
    """The notation's spelling of a record as a reader returns it (or as a writer takes it), as JSON values."""
    if record is None or isinstance(record, bool):
        return record
    if isinstance(record, int):
        return int(record)
    if isinstance(record, float):  # also numpy float64, which msgpack stores as a float
        return _float_to_json(record)
    if isinstance(record, str):
        return str(record)
    if isinstance(record, (bytes, bytearray, memoryview)):
        return {"$bytes": bytes(record).hex()}
    if isinstance(record, (np.ndarray, np.generic)):
        return _array_to_json(np.asarray(record))
    if isinstance(record, dict):
        if all(map(_is_plain_name, record)):
            return {str(key): to_json(value) for key, value in record.items()}
        return {"$map": [[_key_to_json(key), to_json(value)] for key, value in record.items()]}
    if isinstance(record, (list, tuple)):
        return [to_json(value) for value in record]
    raise TypeError(f"the notation has no spelling for {type(record).__name__}")


# -- from_json --------------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARACTERS else text[: _SHOWN_CHARACTERS - 3] + "..."


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer_from_json(value: int) -> int:
    if not _MIN_INTEGER <= value < _INTEGER_BOUND:
        raise ValueError(f"integer {value} is outside msgpack's range [-2**63, 2**64)")
    return value


def _finite_from_json(value: Any) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a JSON number: non-finite floats are spelled {{\"$float\": ...}}")
    return value


def _bytes_from_json(body: Any) -> bytes:
    if not isinstance(body, str) or not _LOWERCASE_HEX.fullmatch(body):
        raise ValueError(f'"$bytes" takes a string of lowercase hex digit pairs, not {_shown(body)}')
    return bytes.fromhex(body)


def _float_from_json(body: Any) -> float:
    if not isinstance(body, str) or body not in _NON_FINITE:
        raise ValueError(f'"$float" takes "NaN", "Infinity" or "-Infinity", not {_shown(body)}')
    return _NON_FINITE[body]


def _map_from_json(body: Any) -> dict[str | int, Any]:
    if not isinstance(body, list):
        raise ValueError(f'"$map" takes a list of [key, value] entries, not {_shown(body)}')
    result: dict[str | int, Any] = {}
    for entry in body:
        if not isinstance(entry, list) or len(entry) != 2:
            raise ValueError(f'a "$map" entry is a [key, value] list, not {_shown(entry)}')
        key, value = entry
        if not (isinstance(key, str) or _is_integer(key)):
            raise ValueError(f'a "$map" key is a string or an integer, not {_shown(key)}')
        if key in result:
            raise ValueError(f'"$map" holds the key {key!r} twice')
        result[key if isinstance(key, str) else _integer_from_json(key)] = from_json(value)
    if all(map(_is_plain_name, result)):
        raise ValueError(f'a map whose keys are all strings not starting with "$" is spelled as a plain object, not {_shown(body)}')
    return result


def _number_from_json(value: Any, dtype: np.dtype) -> float:
    """A float or complex part of an `$array`: a JSON float or a `$float` object."""
    if isinstance(value, dict) and list(value) == ["$float"]:
        return _float_from_json(value["$float"])
    if not isinstance(value, float):
        raise ValueError(f"a {dtype.str} value is a JSON float (with '.' or 'e') or a \"$float\", not {_shown(value)}")
    return _finite_from_json(value)


def _element_checker(dtype: np.dtype) -> Callable[[Any], Any]:
    """A function giving the Python value of one `$array` value of `dtype`, or a ValueError naming it."""
    if dtype.kind == "b":
        def boolean(value: Any) -> bool:
            if not isinstance(value, bool):
                raise ValueError(f"a |b1 value is true or false, not {_shown(value)}")
            return value
        return boolean
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        def integer(value: Any) -> int:
            if not _is_integer(value) or not limits.min <= value <= limits.max:
                raise ValueError(f"a {dtype.str} value is an integer in [{limits.min}, {limits.max}], not {_shown(value)}")
            return value
        return integer
    if dtype.kind == "c":
        def pair(value: Any) -> complex:
            if not isinstance(value, list) or len(value) != 2:
                raise ValueError(f"a {dtype.str} value is a [real, imaginary] pair, not {_shown(value)}")
            return complex(*(_number_from_json(part, dtype) for part in value))
        return pair
    return lambda value: _number_from_json(value, dtype)


def _require_exact(array: np.ndarray, elements: list[Any]) -> None:
    """Refuse a float or complex value that `array`'s dtype rounded: the notation spells values exactly."""
    parts = 2 if array.dtype.kind == "c" else 1
    written = np.array(elements, dtype=np.complex128 if parts == 2 else np.float64).view(np.float64)
    stored = array.view(f"<f{array.dtype.itemsize // parts}").astype(np.float64)
    rounded = np.flatnonzero((stored != written) & ~np.isnan(written))
    if rounded.size:
        value = elements[int(rounded[0]) // parts]
        raise ValueError(f"{value!r} is not a {array.dtype.str} value: the notation spells values exactly")


def _array_from_json(body: Any) -> np.ndarray:
    if not isinstance(body, dict) or set(body) != _ARRAY_MEMBERS:
        raise ValueError(f'"$array" takes an object of exactly "dtype", "shape" and "values", not {_shown(body)}')
    dtype_text, shape, values = body["dtype"], body["shape"], body["values"]
    if not isinstance(dtype_text, str) or dtype_text not in ALLOWED_DTYPES:
        raise ValueError(f'"$array" dtype must be one of {", ".join(ALLOWED_DTYPES)}, not {_shown(dtype_text)}')
    if not isinstance(shape, list) or not all(_is_integer(dim) and dim >= 0 for dim in shape):
        raise ValueError(f'"$array" shape is a list of non-negative integers, not {_shown(shape)}')
    if not isinstance(values, list) or len(values) != math.prod(shape):
        raise ValueError(f'"$array" of shape {shape} takes a list of {math.prod(shape)} values, not {_shown(values)}')
    dtype = np.dtype(dtype_text)
    elements = list(map(_element_checker(dtype), values))
    with np.errstate(over="ignore"):
        array = np.array(elements, dtype=dtype)
    if dtype.kind in "fc":
        _require_exact(array, elements)
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError) as error:
        raise ValueError(f'"$array" shape {shape} is not a shape numpy holds: {error}') from None


_TAGGED: dict[str, Callable[[Any], Any]] = {
    "$bytes": _bytes_from_json,
    "$float": _float_from_json,
    "$array": _array_from_json,
    "$map": _map_from_json,
}


def _object_from_json(value: dict[str, Any]) -> Any:
    if not any(name.startswith("$") for name in value):
        return {name: from_json(item) for name, item in value.items()}
    if len(value) != 1:
        raise ValueError(f'an object with a member name starting with "$" has exactly one member: {_shown(value)}')
    ((tag, body),) = value.items()
    if tag not in _TAGGED:
        raise ValueError(f"unknown tag {tag!r} (known: {', '.join(_TAGGED)}): {_shown(value)}")
    return _TAGGED[tag](body)


def from_json(value: Any) -> Any:
    """The record a spelling stands for (the inverse of `to_json`); ValueError for invalid notation."""
    if isinstance(value, dict):
        return _object_from_json(value)
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if isinstance(value, float):
        return _finite_from_json(value)
    if _is_integer(value):
        return _integer_from_json(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    raise ValueError(f"not a parsed JSON value: {_shown(value)} ({type(value).__name__})")
