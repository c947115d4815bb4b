"""The requests that read a batch's byte ranges, planned at once for every object the batch touches.

Object stores are request-bound: a request costs about the same for 9 KB as for 256 KB, and one carrying
several MiB keeps a connection busy long enough to be worth its latency. `plan_reads` therefore sorts each
object's wanted ranges, joins those within `max_gap` bytes of each other into one request (the hole is read
and dropped), and cuts what grows past `request_bytes` into requests of at most that size, so that a batch
becomes few requests, of a useful size, all of which a transport issues concurrently. `cut_pieces` hands each
wanted range back in the caller's order from the requests' bodies. Pure functions: no I/O, no client.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import VarstoreError

# A hole between two wanted byte ranges up to this size is fetched rather than paid for with a second request.
DEFAULT_MAX_GAP = 64 * 1024
# The most bytes one request carries (Mountpoint's part size): longer spans are cut into requests of this size.
DEFAULT_REQUEST_BYTES = 8 << 20


@dataclass(frozen=True)
class ObjectRanges:
    """The byte ranges [start, end) wanted of the object `name`, which is `size` bytes long."""

    name: str
    size: int
    ranges: Sequence[tuple[int, int]]


@dataclass(frozen=True)
class Request:
    """One ranged GET: bytes [start, end) of the object `name`, `size` bytes long."""

    name: str
    start: int
    end: int
    size: int


@dataclass(frozen=True)
class ReadPlan:
    """The requests of a batch, sorted by object (in the order given) and offset; for each object, its wanted
    ranges as validated integers (in the caller's order) and where its requests end in `requests`."""

    requests: tuple[Request, ...]
    ranges: tuple[tuple[tuple[int, int], ...], ...]
    request_ends: tuple[int, ...]


def plan_reads(
    objects: Sequence[ObjectRanges], *, max_gap: int = DEFAULT_MAX_GAP, request_bytes: int = DEFAULT_REQUEST_BYTES
) -> ReadPlan:
    """The requests that fetch every non-empty range of `objects`: per object, ranges sorted, those overlapping or
    at most `max_gap` bytes apart joined, and runs longer than `request_bytes` cut into requests of at most that
    many bytes (a range longer than that spans consecutive requests). A range that is not integers with
    0 <= start <= end <= size is a `VarstoreError` naming the object, raised before any request is planned."""
    if request_bytes < 1 or max_gap < 0:
        raise ValueError(f"request_bytes must be positive and max_gap not negative, not {request_bytes} and {max_gap}")
    requests: list[Request] = []
    checked: list[tuple[tuple[int, int], ...]] = []
    ends: list[int] = []
    for wanted in objects:
        ranges = tuple((_offset(start, wanted.name), _offset(end, wanted.name)) for start, end in wanted.ranges)
        for start, end in ranges:
            if not 0 <= start <= end <= wanted.size:
                raise VarstoreError(f"byte range [{start}, {end}) is not within the object's {wanted.size} bytes", path=wanted.name)
        checked.append(ranges)
        for start, end in _runs(ranges, max_gap):
            requests += (
                Request(wanted.name, offset, min(offset + request_bytes, end), wanted.size)
                for offset in range(start, end, request_bytes)
            )
        ends.append(len(requests))
    return ReadPlan(tuple(requests), tuple(checked), tuple(ends))


def cut_pieces(plan: ReadPlan, bodies: Sequence[bytes]) -> list[list[bytes]]:
    """Each object's wanted ranges, in the order `plan_reads` was given them, out of `bodies` (the body of each of
    `plan.requests`, in order, each exactly its request's length)."""
    pieces: list[list[bytes]] = []
    first = 0
    for ranges, stop in zip(plan.ranges, plan.request_ends):
        requests, own_bodies = plan.requests[first:stop], bodies[first:stop]
        starts = [request.start for request in requests]
        pieces.append([_cut(requests, own_bodies, starts, start, end) for start, end in ranges])
        first = stop
    return pieces


def _runs(ranges: Sequence[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    """The non-empty `ranges` sorted, those overlapping or at most `max_gap` bytes apart joined."""
    runs: list[tuple[int, int]] = []
    for start, end in sorted(byte_range for byte_range in ranges if byte_range[1] > byte_range[0]):
        if runs and start - runs[-1][1] <= max_gap:
            runs[-1] = (runs[-1][0], max(runs[-1][1], end))
        else:
            runs.append((start, end))
    return runs


def _cut(requests: Sequence[Request], bodies: Sequence[bytes], starts: list[int], start: int, end: int) -> bytes:
    """Bytes [start, end) of an object out of the bodies of its `requests` (sorted, `starts` theirs) that hold them."""
    if start == end:
        return b""
    position = bisect.bisect_right(starts, start) - 1
    request = requests[position]
    if end <= request.end:
        return bodies[position][start - request.start : end - request.start]
    parts = [bodies[position][start - request.start :]]
    while end > requests[position].end:
        position += 1
        parts.append(bodies[position][: end - requests[position].start])
    return b"".join(parts)


def _offset(value: object, name: str) -> int:
    """`value` as a byte offset: an integer (numpy's too), not a bool, a float or a string."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise VarstoreError(f"a byte offset must be an integer, not {type(value).__name__} {value!r}", path=name)
