"""How ``--field NAME`` finds a value in a structured sample, the same for ``convert`` and ``dump``.

A dotted name is a path into nested maps: ``meta.caption`` is ``sample["meta"]["caption"]``.
A key that itself holds a dot is found too, the longest key matching wins at each level:
``a.b`` is ``sample["a.b"]`` if that key exists, else ``sample["a"]["b"]``.
"""

from __future__ import annotations

from typing import Any, Collection

from ..errors import CommandError, listing


def matching_key(keys: Collection[Any], parts: list[str]) -> tuple[Any, int] | None:
    """(the key of `keys` that the longest leading run of `parts` names, how many parts it took), or None.

    A single part written as an integer in ASCII digits (``3``, ``-1``) also finds an integer key, since msgpack
    maps may have them; other digits (``²``, ``①``) are only names.
    """
    for taken in range(len(parts), 0, -1):
        name = ".".join(parts[:taken])
        if name in keys:
            return name, taken
    first = parts[0]
    digits = first.removeprefix("-")
    if digits.isascii() and digits.isdigit() and int(first) in keys:
        return int(first), 1
    return None


def field_value(sample: Any, field: str, where: str) -> Any:
    """The value that `field` names in `sample`; a one-line error naming `where` if there is none."""
    value, parts, reached = sample, field.split("."), []
    while parts:
        place = ".".join(reached) or "the record"
        if not isinstance(value, dict):
            raise CommandError(f"{where}: no field {field!r}: {place} is {kind(value)}, not a map")
        match = matching_key(value, parts)
        if match is None:
            raise CommandError(f"{where}: no field {field!r}: {place} has {listing([str(key) for key in value]) or 'no fields'}")
        key, taken = match
        value = value[key]
        reached.append(str(key))
        parts = parts[taken:]
    return value


def kind(value: Any) -> str:
    """``null``, ``an int``, ``a list``: a value's type as a sentence names it."""
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
