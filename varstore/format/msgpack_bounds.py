"""Bounds on an untrusted msgpack payload, checked before msgpack builds anything from it.

msgpack's unpacker allocates each container at the size its header claims, so a
few hundred bytes of nested headers, each claiming millions of elements, make it
reserve gigabytes before it notices that the elements are missing.
`check_msgpack` walks the bytes first without creating any object and refuses a
payload unless it is exactly one object whose containers claim no more elements
than bytes remain, nested at most `MAX_DEPTH` deep, using no extension type but
the one allowed, whose maps have only str and integer keys, none twice (so a
record decodes to one dict whatever the decoder, and every key is hashable), and
whose objects cost at most `COST_PER_BYTE` bytes of memory per payload byte plus
`COST_ALLOWANCE`, by §2.2's cost of each kind of object (so a record of a million
empty maps is refused, not unpacked into 80 MB). After it passes, unpacking
allocates no more than that.

The C extension's `msgpack_passes` answers first where it is built: True only for
a payload this check accepts (it declines maps of more than 32 keys), so this
walk runs only to refuse a payload, with its message, or to accept a large map.
"""

from __future__ import annotations

import re

from .._native import speedups

# The deepest nesting of containers a record may have (spec §2.2); writers run this same check.
MAX_DEPTH = 512

# §2.2's memory rule: the costs of a record's objects, summed as below, are at most this many per payload byte plus
# the allowance (the costs are CPython's sizes of what msgpack builds, rounded up as its allocator rounds them).
COST_PER_BYTE = 16
COST_ALLOWANCE = 128 << 10

_SMALL_COST = 8  # a reference to a shared object: nil, booleans, integers in [-5, 255], str and bin of 0 or 1 byte
_NUMBER_COST = 40  # any other integer, a float
_ARRAY_COST = 80  # plus its elements
_MAP_COST, _MAP_ENTRY_COST = 144, 72  # plus its keys and values
_ASCII_STR_COST, _STR_COST, _STR_BYTE_COST = 72, 88, 4  # a str of n >= 2 bytes: 72 + n if ASCII, else 88 + 4n
_BIN_COST = 56  # a bin of n >= 2 bytes: 56 + n
_EXT_COST, _EXT_BYTE_COST = 288, 3  # an extension of n data bytes: 288 + 3n

_FIXED, _ARRAY, _MAP, _STR, _BIN, _EXT, _INVALID = range(7)


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
        table[byte] = (_STR, 1, 0, byte & 0x1F)  # fixstr
    for byte, size in ((0xC0, 1), (0xC2, 1), (0xC3, 1), (0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5),
                       (0xCF, 9), (0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
        table[byte] = (_FIXED, size, 0, 0)  # nil, false, true, floats, integers
    for byte, length_size in ((0xC4, 1), (0xC5, 2), (0xC6, 4)):
        table[byte] = (_BIN, 1 + length_size, length_size, 0)
    for byte, length_size in ((0xD9, 1), (0xDA, 2), (0xDB, 4)):
        table[byte] = (_STR, 1 + length_size, length_size, 0)
    for byte, length_size in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        table[byte] = (_EXT, 2 + length_size, length_size, 0)
    for byte, length in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        table[byte] = (_EXT, 2, 0, length)  # fixext
    for byte, kind, length_size in ((0xDC, _ARRAY, 2), (0xDD, _ARRAY, 4), (0xDE, _MAP, 2), (0xDF, _MAP, 4)):
        table[byte] = (kind, 1 + length_size, length_size, 0)
    return table


_LAYOUTS = _layouts()


def _scalar_cost(byte: int) -> int:
    """§2.2's cost of the scalar (or fixstr, taken as ASCII) that starts with `byte`."""
    kind, _, _, length = _LAYOUTS[byte]
    if kind == _STR:
        return _SMALL_COST if length <= 1 else _ASCII_STR_COST + length
    small = byte < 0x80 or byte >= 0xFB or byte in (0xC0, 0xC2, 0xC3, 0xCC)  # fixint 0..127, -5..-1, nil, bools, uint 8
    return _SMALL_COST if small else _NUMBER_COST


# Per first byte, for the walk that skips scalars: the size of a scalar or fixstr (0 for anything else), its cost
# with a fixstr taken as ASCII, and what a fixstr would cost more if it is not (so a walk can bound it unread).
_FIXED_SIZES = bytes(header + length if kind in (_FIXED, _STR) and not length_size else 0
                     for kind, header, length_size, length in _LAYOUTS)
_FIXED_COSTS = bytes(_scalar_cost(byte) if _FIXED_SIZES[byte] else 0 for byte in range(256))
_NON_ASCII_EXTRA = bytes(_STR_COST - _ASCII_STR_COST + (_STR_BYTE_COST - 1) * length
                         if kind == _STR and not length_size and length > 1 else 0
                         for kind, _, length_size, length in _LAYOUTS)
_SCALAR_SIZES = bytes(size if kind == _FIXED else 0 for size, (kind, *_) in zip(_FIXED_SIZES, _LAYOUTS))

_NON_ASCII = re.compile(rb"[\x80-\xff]")


def _str_cost(payload: bytes, start: int, length: int, exact: bool) -> tuple[int, int]:
    """§2.2's cost of a str of `length` bytes at `start` and, unless `exact`, what it costs more if not ASCII
    (then taken as ASCII without reading it)."""
    if length <= 1:
        return _SMALL_COST, 0
    if not exact:
        return _ASCII_STR_COST + length, _STR_COST - _ASCII_STR_COST + (_STR_BYTE_COST - 1) * length
    if _NON_ASCII.search(payload, start, start + length) is None:
        return _ASCII_STR_COST + length, 0
    return _STR_COST + _STR_BYTE_COST * length, 0


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


def memory_limit(size: int) -> int:
    """The most §2.2's costs of a record's objects may sum to, for a payload of `size` bytes."""
    return COST_PER_BYTE * size + COST_ALLOWANCE


def check_msgpack(payload: bytes, ext_type: int) -> None:
    """Raise ValueError unless `payload` is one well-formed, bounded msgpack object (see the module docstring)."""
    if speedups is not None and speedups.msgpack_passes(payload, ext_type):
        return
    limit = memory_limit(len(payload))
    cost, non_ascii_extra = _walk(payload, ext_type, limit, exact=False)
    if cost + non_ascii_extra > limit:  # the bound with every str taken as non-ASCII does not pass: count exactly
        cost, _ = _walk(payload, ext_type, limit, exact=True)
    if cost > limit:
        raise _over_limit(cost, len(payload), limit)


def _over_limit(cost: int, size: int, limit: int) -> ValueError:
    return ValueError(
        f"its objects cost {cost} bytes of memory by §2.2's count, over the limit of {COST_PER_BYTE} per payload byte "
        f"+ {COST_ALLOWANCE} = {limit} for its {size} bytes (many tiny values: store numbers as one numpy array)"
    )


def _walk(payload: bytes, ext_type: int, limit: int, *, exact: bool) -> tuple[int, int]:
    """Walk `payload` as `check_msgpack` says, returning its objects' cost by §2.2 and, unless `exact`, what its
    strs, taken as ASCII, would cost more if none were (so a caller can skip the exact count when even that passes).
    Raises once the containers alone cost over `limit`."""
    end = len(payload)
    position = 0
    remaining = 1  # elements still expected by the innermost open container (the payload counts as one)
    cost = extra = 0
    keys: set[int | bytes] | None = None  # the keys read so far when the innermost container is a map
    outer: list[tuple[int, set[int | bytes] | None]] = []  # the same two for each enclosing container
    fixed_sizes = _SCALAR_SIZES if exact else _FIXED_SIZES  # the exact count reads every str
    fixed_costs, non_ascii_extra = _FIXED_COSTS, _NON_ASCII_EXTRA
    try:
        while True:
            if keys is None:
                while remaining:
                    byte = payload[position]
                    size = fixed_sizes[byte]
                    if not size:
                        break
                    position += size
                    cost += fixed_costs[byte]
                    extra += non_ascii_extra[byte]
                    remaining -= 1
            else:
                while remaining:
                    if not remaining & 1:  # a map's elements alternate key, value: an even count means a key is next
                        byte = payload[position]
                        if 0xA0 <= byte < 0xC0:  # fixstr, the usual key, read here for speed
                            size = 1 + (byte & 0x1F)
                            key = payload[position + 1 : position + size]
                            key_cost, key_extra = _str_cost(payload, position + 1, size - 1, exact)
                        else:
                            key, size = _map_key(payload, position)
                            key_cost, key_extra = (
                                _str_cost(payload, position + size - len(key), len(key), exact)
                                if isinstance(key, bytes) else (fixed_costs[byte], 0)
                            )
                        if key in keys:
                            raise ValueError(f"the map key at byte {position} repeats an earlier key of its map")
                        keys.add(key)
                        position += size
                        cost += key_cost
                        extra += key_extra
                        remaining -= 1
                    byte = payload[position]
                    size = fixed_sizes[byte]
                    if not size:
                        break
                    position += size
                    cost += fixed_costs[byte]
                    extra += non_ascii_extra[byte]
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
            if kind == _STR:
                item_cost, item_extra = _str_cost(payload, position, length, exact)
                cost += item_cost
                extra += item_extra
            elif kind == _BIN:
                cost += _SMALL_COST if length <= 1 else _BIN_COST + length
            elif kind == _EXT:
                cost += _EXT_COST + _EXT_BYTE_COST * length
            if kind == _STR or kind == _BIN or kind == _EXT:
                position += length
                continue
            count = 2 * length if kind == _MAP else length
            if count > end - position:
                raise ValueError(
                    f"a container at byte {position - header} claims {length} elements, more than the {end - position} bytes left"
                )
            if len(outer) >= MAX_DEPTH:
                raise ValueError(f"msgpack containers nest deeper than {MAX_DEPTH}")
            cost += _MAP_COST + _MAP_ENTRY_COST * length if kind == _MAP else _ARRAY_COST
            if cost > limit:
                raise _over_limit(cost, end, limit)
            outer.append((remaining, keys))
            remaining = count
            keys = set() if kind == _MAP else None
    except IndexError:
        raise ValueError(f"msgpack data ends at byte {end}, inside an object") from None
    if position != end:
        raise ValueError(f"msgpack object ends at byte {position}, the payload at byte {end}")
    return cost, extra
