"""Bounds on an untrusted msgpack payload, checked before msgpack builds anything from it.

msgpack's unpacker allocates each container at the size its header claims, so a
few hundred bytes of nested headers, each claiming millions of elements, make it
reserve gigabytes before it notices that the elements are missing.
`check_msgpack` walks the bytes first without creating any object and refuses a
payload unless it is exactly one object whose containers claim no more elements
than bytes remain, nested at most `MAX_DEPTH` deep, using no extension type but
the one allowed. After it passes, unpacking allocates in proportion to the payload.
"""

from __future__ import annotations

# msgpack-python's packer refuses to nest deeper than this, so every record it writes passes.
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


def check_msgpack(payload: bytes, ext_type: int) -> None:
    """Raise ValueError unless `payload` is one well-formed, bounded msgpack object (see the module docstring)."""
    end = len(payload)
    position = 0
    remaining = 1  # elements still expected by the innermost open container (the payload counts as one)
    outer: list[int] = []  # the same for each enclosing container
    fixed_sizes = _FIXED_SIZES
    try:
        while True:
            while remaining:
                size = fixed_sizes[payload[position]]
                if not size:
                    break
                position += size
                remaining -= 1
            if not remaining:
                if not outer:
                    break
                remaining = outer.pop()
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
            outer.append(remaining)
            remaining = count
    except IndexError:
        raise ValueError(f"msgpack data ends at byte {end}, inside an object") from None
    if position != end:
        raise ValueError(f"msgpack object ends at byte {position}, the payload at byte {end}")
