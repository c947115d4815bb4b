"""Bounds on an untrusted msgpack payload, checked before msgpack builds anything from it.

msgpack's unpacker allocates each container at the size its header claims, so a
few hundred bytes of nested headers, each claiming millions of elements, make it
reserve gigabytes before it notices that the elements are missing.
`check_msgpack` walks the bytes first without creating any object and refuses a
payload unless it is exactly one object whose containers claim no more elements
than bytes remain, nested at most `MAX_DEPTH` deep, using no extension type but
the one allowed, and whose maps have only str and integer keys, none twice (so a
record decodes to one dict whatever the decoder, and every key is hashable).
After it passes, unpacking allocates in proportion to the payload.

The C extension's `msgpack_passes` answers first where it is built: True only for
a payload this check accepts (it declines maps of more than 32 keys), so this
walk runs only to refuse a payload, with its message, or to accept a large map.
"""

from __future__ import annotations

from .._native import speedups

# The deepest nesting of containers a record may have (spec §2.2); writers run this same check.
MAX_DEPTH = 512

_FIXED, _ARRAY, _MAP, _RAW, _EXT, _INVALID = range(6)


def _layouts() -> list[tuple[int, int, int, int]]:
    """For each first byte: (kind, header size, size of its big-endian length field, length when the byte holds it)."""
    table = [(_INVALID, 0, 0, 0)] * 256
    for byte in range(0x00, 0x80):
        table[byte] = (_FIXED, 1, 0, 0)  # positive fixint
    for byte in range(0xE0, 0x100):
        table[byte] = (_FIXED, 1, 0, 0)  # negative fixint
    for byte in range(0x80, 0x90):
        table[byte] = (_MAP, 1, 0, byte & 0x0F)
    for byte in range(0x90, 0xA0):
        table[byte] = (_ARRAY, 1, 0, byte & 0x0F)
    for byte in range(0xA0, 0xC0):
        table[byte] = (_FIXED, 1 + (byte & 0x1F), 0, 0)  # fixstr
    for byte, size in ((0xC0, 1), (0xC2, 1), (0xC3, 1), (0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5),
                       (0xCF, 9), (0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
        table[byte] = (_FIXED, size, 0, 0)  # nil, false, true, floats, integers
    for byte, length_size in ((0xC4, 1), (0xC5, 2), (0xC6, 4), (0xD9, 1), (0xDA, 2), (0xDB, 4)):
        table[byte] = (_RAW, 1 + length_size, length_size, 0)  # bin and str
    for byte, length_size in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        table[byte] = (_EXT, 2 + length_size, length_size, 0)
    for byte, length in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        table[byte] = (_EXT, 2, 0, length)  # fixext
    for byte, kind, length_size in ((0xDC, _ARRAY, 2), (0xDD, _ARRAY, 4), (0xDE, _MAP, 2), (0xDF, _MAP, 4)):
        table[byte] = (kind, 1 + length_size, length_size, 0)
    return table


_LAYOUTS = _layouts()
_FIXED_SIZES = bytes(header if kind == _FIXED else 0 for kind, header, _, _ in _LAYOUTS)

# Map keys other than fixint and fixstr: the size of the length field of a str, or of an integer and its signedness.
_STR_KEY_LENGTH_SIZES = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_INT_KEY_SIZES = {0xCC: (1, False), 0xCD: (2, False), 0xCE: (4, False), 0xCF: (8, False),
                  0xD0: (1, True), 0xD1: (2, True), 0xD2: (4, True), 0xD3: (8, True)}


def _map_key(payload: bytes, position: int) -> tuple[int | bytes, int]:
    """The map key at `position` (not a fixstr, which the caller reads) as an int, or a str key as its
    UTF-8 bytes, and its size in bytes. A key running past the payload's end is truncated here; the
    caller's read of the value that must follow it then fails."""
    byte = payload[position]
    if byte < 0x80:
        return byte, 1
    if byte >= 0xE0:
        return byte - 0x100, 1
    if byte in _INT_KEY_SIZES:
        size, signed = _INT_KEY_SIZES[byte]
        return int.from_bytes(payload[position + 1 : position + 1 + size], "big", signed=signed), 1 + size
    if byte in _STR_KEY_LENGTH_SIZES:
        start = position + 1 + _STR_KEY_LENGTH_SIZES[byte]
        length = int.from_bytes(payload[position + 1 : start], "big")
        return payload[start : start + length], start + length - position
    raise ValueError(f"the map key at byte {position} is not a str or an integer")


def check_msgpack(payload: bytes, ext_type: int) -> None:
    """Raise ValueError unless `payload` is one well-formed, bounded msgpack object (see the module docstring)."""
    if speedups is not None and speedups.msgpack_passes(payload, ext_type):
        return
    end = len(payload)
    position = 0
    remaining = 1  # elements still expected by the innermost open container (the payload counts as one)
    keys: set[int | bytes] | None = None  # the keys read so far when the innermost container is a map
    outer: list[tuple[int, set[int | bytes] | None]] = []  # the same two for each enclosing container
    fixed_sizes = _FIXED_SIZES
    try:
        while True:
            if keys is None:
                while remaining:
                    size = fixed_sizes[payload[position]]
                    if not size:
                        break
                    position += size
                    remaining -= 1
            else:
                while remaining:
                    if not remaining & 1:  # a map's elements alternate key, value: an even count means a key is next
                        byte = payload[position]
                        if 0xA0 <= byte < 0xC0:  # fixstr, the usual key, read here for speed
                            size = 1 + (byte & 0x1F)
                            key = payload[position + 1 : position + size]
                        else:
                            key, size = _map_key(payload, position)
                        if key in keys:
                            raise ValueError(f"the map key at byte {position} repeats an earlier key of its map")
                        keys.add(key)
                        position += size
                        remaining -= 1
                    size = fixed_sizes[payload[position]]
                    if not size:
                        break
                    position += size
                    remaining -= 1
            if not remaining:
                if not outer:
                    break
                remaining, keys = outer.pop()
                continue
            remaining -= 1
            kind, header, length_size, length = _LAYOUTS[payload[position]]
            if kind == _INVALID:
                raise ValueError(f"byte {position} is 0xc1, which msgpack never uses")
            if position + header > end:
                raise IndexError
            if length_size:
                length = int.from_bytes(payload[position + 1 : position + 1 + length_size], "big")
            if kind == _EXT:
                code = payload[position + header - 1]
                code = code - 256 if code > 127 else code
                if code != ext_type:
                    raise ValueError(f"msgpack extension type {code} at byte {position} is not allowed")
            position += header
            if kind == _RAW or kind == _EXT:
                position += length
                continue
            count = 2 * length if kind == _MAP else length
            if count > end - position:
                raise ValueError(
                    f"a container at byte {position - header} claims {length} elements, more than the {end - position} bytes left"
                )
            if len(outer) >= MAX_DEPTH:
                raise ValueError(f"msgpack containers nest deeper than {MAX_DEPTH}")
            outer.append((remaining, keys))
            remaining = count
            keys = set() if kind == _MAP else None
    except IndexError:
        raise ValueError(f"msgpack data ends at byte {end}, inside an object") from None
    if position != end:
        raise ValueError(f"msgpack object ends at byte {position}, the payload at byte {end}")
