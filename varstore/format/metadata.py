"""A shard's metadata block and the strict, canonical JSON it is written in (§1.4).

Metadata is one UTF-8 JSON object, ``{"codec": {...}, "user": {...}}``, at most `MAX_METADATA_SIZE` bytes and
`MAX_METADATA_DEPTH` arrays and objects deep. Writers spell it as canonical JSON, so equal inputs give equal
bytes; readers refuse anything RFC 8259 or §1.4 forbids (duplicate names, NaN, out-of-range integers, lone
surrogates, a byte order mark) before trusting it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from ..errors import FormatError

MAX_METADATA_SIZE = 16 << 20


MAX_METADATA_DEPTH = 64  # arrays and objects, the outer object included


MIN_JSON_INT, MAX_JSON_INT = -(1 << 63), 1 << 64  # JSON integers (no fraction, no exponent) lie in [MIN, MAX)


def dump_strict_json(value: Any, *, what: str, **options: Any) -> bytes:
    """`value` as UTF-8 JSON that `parse_strict_json` accepts back: str member names, integers in
    [-2**63, 2**64), finite floats, Unicode text, at most MAX_METADATA_DEPTH arrays and objects deep
    (`options` go to json.dumps: key order, spacing)."""
    _check_json_value(value, what)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, **options)
    except (TypeError, ValueError) as error:
        raise FormatError(f"{what} must be JSON-serialisable: {error}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise FormatError(
            f"{what} holds text that is not valid Unicode (a lone surrogate {text[error.start]!r}), which UTF-8 cannot encode"
        ) from None


def _check_json_value(value: Any, what: str) -> None:
    """Refuse what JSON would change or a reader would refuse: member names that are not str (json.dumps
    turns ``{10: 1, 9: 2}`` into ``{"9":2,"10":1}``, out of code-point order), integers outside [-2**63, 2**64),
    nesting deeper than MAX_METADATA_DEPTH. Iterative and depth-bounded, so neither deep nor cyclic input recurses."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_METADATA_DEPTH:
                raise FormatError(f"{what} nests deeper than the limit of {MAX_METADATA_DEPTH} arrays and objects")
            if isinstance(item, dict):
                for name in item:
                    if not isinstance(name, str):
                        raise FormatError(f"{what} has the member name {name!r}: JSON object keys must be strings")
                item = item.values()
            pending.extend((member, depth + 1) for member in item)
        elif isinstance(item, int) and not isinstance(item, bool) and not MIN_JSON_INT <= item < MAX_JSON_INT:
            raise FormatError(f"{what} holds the integer {_short_int(item)}, outside [-2**63, 2**64)")


def _short_int(value: int) -> str:
    """`value` in decimal, or its size when the decimal would be long (str() refuses over 4300 digits)."""
    return str(value) if value.bit_length() <= 256 else f"of {value.bit_length()} bits"


def canonical_json(value: Any, *, what: str) -> bytes:
    """`value` as the canonical JSON bytes of §1.4, the one spelling every writer of the format produces:
    members sorted by the code points of their names, no white space, raw UTF-8 but for the escapes of
    `"`, `\\` and U+0000-U+001F, numbers spelled as Python's repr spells them (shortest round trip)."""
    return dump_strict_json(value, what=what, sort_keys=True, separators=(",", ":"))


DATA_CRC_MEMBER = "data_crc32c"  # the member saying the header's data_crc32c is not recorded (§1.2)


DATA_CRC_UNRECORDED = "not recorded"  # its one value


def encode_metadata(codec_params: dict[str, Any], user: dict[str, Any], compression: dict[str, Any] | None = None,
                    *, data_crc_recorded: bool = True) -> bytes:
    """The metadata block: canonical JSON, so equal inputs give equal bytes; refuses what a reader would refuse.
    `compression` is the member a compressed shard (or one "auto" left raw) holds (§1.6); without
    `data_crc_recorded` the block says the header's data_crc32c is not recorded (§1.2)."""
    members = {"codec": codec_params, "user": user} | ({"compression": compression} if compression is not None else {})
    if not data_crc_recorded:
        members[DATA_CRC_MEMBER] = DATA_CRC_UNRECORDED
    raw = canonical_json(members, what="metadata")
    if len(raw) > MAX_METADATA_SIZE:
        raise FormatError(f"metadata is {len(raw)} bytes, over the limit of {MAX_METADATA_SIZE}")
    return raw


def decode_metadata(raw: bytes, *, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse a metadata block into (codec parameters, user metadata), refusing anything RFC 8259 or §1.4 forbids."""
    return metadata_members(parse_strict_json(raw, MAX_METADATA_DEPTH, what="metadata", path=path), path=path)


def metadata_members(value: Any, *, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (codec parameters, user metadata) of a metadata block already parsed as `value`."""
    if not isinstance(value, dict):
        raise FormatError(f"metadata must be a JSON object, found {type(value).__name__}", path=path)
    codec_params, user = value.get("codec"), value.get("user")
    if not isinstance(codec_params, dict) or not isinstance(user, dict):
        raise FormatError('metadata must hold the objects "codec" and "user"', path=path)
    return codec_params, user


def parse_strict_json(raw: bytes, max_depth: int, *, what: str, path: str) -> Any:
    """`raw` parsed as strict UTF-8 JSON: no BOM, NaN or Infinity, float overflowing float64, integer outside
    [-2**63, 2**64), duplicate member name, lone surrogate escape, or nesting deeper than `max_depth` (checked
    before parsing, so deep input never recurses)."""
    try:
        if raw.startswith(b"\xef\xbb\xbf"):
            raise ValueError("it starts with a byte order mark")
        text = raw.decode("utf-8")
        depth, cost, members = json_shape(raw)
        if depth > max_depth:
            raise ValueError(f"arrays and objects nest {depth} deep, over the limit of {max_depth}")
        if cost > memory_limit(len(raw)):
            raise ValueError(_over_limit(cost, len(raw)))
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
        if _member_count(value) != members:
            raise ValueError(f"{_repeated_name(text)} appears twice in one object")
        if _MAYBE_SURROGATE_ESCAPE.search(text) and _holds_surrogate(value):
            raise ValueError("a string holds a lone surrogate escape (\\ud800-\\udfff), which is not Unicode text")
    except (UnicodeDecodeError, ValueError) as error:
        raise FormatError(f"{what} is not valid UTF-8 JSON: {error}", path=path) from None
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _over_limit(cost: int, size: int) -> str:
    return (
        f"its objects, arrays, members and commas cost {cost} bytes of memory by §1.4's count, over the limit of "
        f"{COST_PER_BYTE} per byte + {COST_ALLOWANCE} = {memory_limit(size)} for its {size} bytes "
        "(many tiny containers: store such data in records, not metadata)"
    )


def _member_count(value: Any) -> int:
    """How many members the objects of a parsed JSON value hold; fewer than the text's `:` means a name repeated
    (json keeps the last), so duplicates are found without building a list of pairs per object."""
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            count += len(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return count


def _repeated_name(text: str) -> str:
    """A name some object of `text` repeats, found by parsing it again, now keeping every object's pairs (only
    on the way to refusing it, so the pairs' extra memory is spent once)."""
    found: list[str] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> None:
        names = [name for name, _ in pairs]
        if not found and len(set(names)) != len(names):
            found.extend(name for position, name in enumerate(names) if name in names[:position])

    json.loads(text, object_pairs_hook=pairs_hook)
    return f"member name {found[0]!r}" if found else "a member name"


def _bounded_int(text: str) -> int:
    # Twenty characters hold every integer in range ("-9223372036854775808"); a longer one is out of range
    # without converting it (int() of a long digit string is slow, and refused past 4300 digits).
    value = int(text) if len(text) <= 20 else None
    if value is None or not MIN_JSON_INT <= value < MAX_JSON_INT:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise ValueError(f"integer {shown} is outside [-2**63, 2**64)")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} overflows to infinity")
    return value


# A \u escape of a surrogate; paired ones are legal, so a hit only triggers the exact check of `_holds_surrogate`.
_MAYBE_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _holds_surrogate(value: Any) -> bool:
    """Whether any string (member name or value) in a parsed JSON value holds a surrogate code point."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


# §1.4's memory rule: the structure of a JSON text, counted outside strings, costs at most this many per byte of it
# plus the allowance (the same bound as §2.2's for msgpack records). The costs are CPython's: an object is a dict, an
# array a list, a member a dict entry and its key's hash-table slot, a comma one more reference in its container.
COST_PER_BYTE = 16
COST_ALLOWANCE = 128 << 10
_STRUCTURE_COSTS = np.zeros(256, np.int64)
_STRUCTURE_COSTS[[ord("{"), ord("["), ord(":"), ord(",")]] = (144, 80, 48, 8)


_DEPTH_STEPS = np.zeros(256, np.int8)
_DEPTH_STEPS[[ord("["), ord("{")]] = 1
_DEPTH_STEPS[[ord("]"), ord("}")]] = -1


_BACKSLASH, _QUOTE = ord("\\"), ord('"')


_SCAN_CHUNK = 1 << 16


def memory_limit(size: int) -> int:
    """The most §1.4's structure cost of a JSON text of `size` bytes may be."""
    return COST_PER_BYTE * size + COST_ALLOWANCE


def json_shape(raw: bytes) -> tuple[int, int, int]:
    """How deep arrays and objects nest in the JSON text `raw`, its structure cost by §1.4 (144 per `{`, 80 per
    `[`, 48 per `:`, 8 per `,`) and its count of `:` (members), all counted outside strings, without parsing.

    A quote ends a string unless an odd run of backslashes precedes it. Vectorised over
    bounded chunks, so it allocates at most a few bytes per byte of one chunk. On malformed
    text the counts may be off after the first error, but a parser stops there, so it never
    nests deeper or builds more than they say.
    """
    data = np.frombuffer(raw, np.uint8)
    depth = deepest = cost = members = 0
    quotes_so_far = 0  # unescaped quotes before the chunk: odd means the chunk starts inside a string
    last_plain = -1  # position of the last byte before the chunk that is not a backslash
    for start in range(0, len(data), _SCAN_CHUNK):
        chunk = data[start : start + _SCAN_CHUNK]
        positions = np.arange(start, start + len(chunk), dtype=np.int32)
        plain = np.maximum.accumulate(np.where(chunk == _BACKSLASH, np.int32(last_plain), positions))
        plain_before = np.concatenate(([last_plain], plain[:-1])).astype(np.int32)
        escaped = (positions - 1 - plain_before) & 1 == 1  # an odd run of backslashes right before
        quotes = np.cumsum((chunk == _QUOTE) & ~escaped, dtype=np.int32) + quotes_so_far
        outside = chunk[(quotes & 1) == 0]
        running = np.cumsum(_DEPTH_STEPS[outside], dtype=np.int32) + depth
        if len(running):
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
        cost += int(_STRUCTURE_COSTS[outside].sum())
        members += int(np.count_nonzero(outside == ord(":")))
        quotes_so_far, last_plain = int(quotes[-1]), int(plain[-1])
    return deepest, cost, members
