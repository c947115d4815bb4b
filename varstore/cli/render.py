"""Decoded records as text for people: hex views of bytes, quoted text, arrays and structured samples, all capped in length."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from .output import plural

_HEX_ROW_BYTES = 16
_INLINE_PREVIEW_BYTES = 16
_INLINE_WIDTH = 100
_INDENT = "  "


def _cap(limit: int) -> int:
    return sys.maxsize if limit == 0 else limit


def hex_view(data: bytes | memoryview, limit: int) -> str:
    """Rows of ``offset: hex pairs  ascii`` like ``xxd``, showing at most `limit` bytes (0: all)."""
    if not len(data):
        return "(empty)"
    shown = bytes(data[: _cap(limit)])
    rows = []
    for offset in range(0, len(shown), _HEX_ROW_BYTES):
        row = shown[offset : offset + _HEX_ROW_BYTES]
        pairs = " ".join(row[start : start + 2].hex() for start in range(0, len(row), 2))
        text = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in row)
        rows.append(f"{offset:08x}: {pairs:<39}  {text}")
    if len(data) > len(shown):
        rows.append(f"... {plural(len(data) - len(shown), 'more byte')} (--limit 0 shows all, --raw writes them)")
    return "\n".join(rows)


def render_text(text: str, limit: int) -> str:
    """`text` quoted and escaped as a JSON string, cut after `limit` characters (0: all)."""
    shown = text[: _cap(limit)]
    quoted = json.dumps(shown, ensure_ascii=False)
    if len(text) > len(shown):
        quoted += f"... ({len(text) - len(shown):,} more characters)"
    return quoted


def render_array(array: np.ndarray, limit: int) -> str:
    """An array's values, at most `limit` of them (0: all): an array with more shows its first rows that fit (its
    first `limit` elements, in C order, when one row holds more), and says how many elements it leaves out."""
    if array.size <= _cap(limit):
        return _array_text(array)
    row_size = array.size // len(array)
    shown = array[: limit // row_size] if array.ndim > 1 and row_size <= limit else array.reshape(-1)[:limit]
    return f"{_array_text(shown)} ... ({plural(array.size - shown.size, 'more element')})"


def _array_text(array: np.ndarray) -> str:
    return np.array2string(array, threshold=sys.maxsize, separator=" ")


def _inline_array(array: np.ndarray, limit: int) -> str:
    values = " ".join(render_array(array, limit).split())
    return f"<ndarray {array.dtype.name} {tuple(array.shape)}: {values}>"


def _inline_bytes(data: bytes, limit: int) -> str:
    shown = data[: min(_cap(limit), _INLINE_PREVIEW_BYTES)]
    more = "..." if len(data) > len(shown) else ""
    return f"<{plural(len(data), 'byte')}: {shown.hex()}{more}>"


def _leaf(value: Any, limit: int) -> str:
    if isinstance(value, np.ndarray):
        return _inline_array(value, limit)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _inline_bytes(bytes(value), limit)
    if isinstance(value, str):
        return render_text(value, limit)
    return json.dumps(value)


def _shown_items(value: dict[Any, Any] | list[Any], limit: int) -> tuple[list[Any], str | None]:
    """The first `limit` items of a map (its (key, value) pairs) or list (0: all), and what says the rest, if any."""
    items = list(value.items()) if isinstance(value, dict) else value
    shown = items[: _cap(limit)]
    left_out = len(items) - len(shown)
    return shown, f"... ({plural(left_out, 'more item')})" if left_out else None


def _key(key: Any) -> str:
    """A map's key, whole whatever the limit: it names the value that follows."""
    return _leaf(key, 0)


def _inline(value: Any, limit: int) -> str:
    if not isinstance(value, (dict, list)):
        return _leaf(value, limit)
    shown, rest = _shown_items(value, limit)
    if isinstance(value, dict):
        parts = [f"{_key(key)}: {_inline(item, limit)}" for key, item in shown]
    else:
        parts = [_inline(item, limit) for item in shown]
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + ", ".join(parts + ([rest] if rest else [])) + closing


def render_sample(value: Any, limit: int, indent: str = "") -> str:
    """A structured sample as JSON-like text: one line when it is short, else one item per line; a map or list
    shows at most `limit` items (0: all)."""
    inline = _inline(value, limit)
    if len(indent) + len(inline) <= _INLINE_WIDTH or not isinstance(value, (dict, list)) or not value:
        return inline
    inner = indent + _INDENT
    shown, rest = _shown_items(value, limit)
    if isinstance(value, dict):
        items = [f"{inner}{_key(key)}: {render_sample(item, limit, inner)}" for key, item in shown]
        opening, closing = "{", "}"
    else:
        items = [inner + render_sample(item, limit, inner) for item in shown]
        opening, closing = "[", "]"
    items += [inner + rest] if rest else []
    return opening + "\n" + ",\n".join(items) + "\n" + indent + closing
