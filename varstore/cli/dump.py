"""``varstore dump``: print records decoded by their codec, as JSON lines, or as their exact payload bytes."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from ..conversion.fields import field_value, kind
from ..dataset.reader import ShardedReader
from ..errors import CommandError, UsageError
from ..format.msgpack_bounds import MAX_DEPTH
from ..format.notation import to_json
from ..operations.locations import Store
from .arguments import STORE_HELP, command_parser, non_negative_int, store_path
from .output import plural, print_json, writing_to_standard_output
from .render import hex_view, render_array, render_sample, render_text
from .stores import REMOTE_EPILOG, add_location_options, open_store

_CHUNK_RECORDS = 256
# Rendering a record recurses through its containers, a few Python frames per level.
_FRAMES_PER_LEVEL = 4
NAME = "dump"

_DESCRIPTION = """Print records decoded by their codec: arrays with dtype, shape and values, structured samples as
JSON-like text, text quoted, bytes as a hex and ASCII view. Prints every record unless told which."""
_EPILOG = ("selection:\n  -i INDEX must name a record: an index past either end is an error. --range, --head and --tail\n"
           "  clamp to the records there are, like a Python slice: --range 40:50 of 44 records prints 40 to 43.\n\n"
           "examples:\n  varstore dump docs -i 0 -i -1\n  varstore dump train/ --range -10:\n"
           "  varstore dump docs --head 5 --json | jq .record\n"
           "  varstore dump images -i 3 --field image --raw > 3.jpg   (a folder converted with --labels)\n"
           "  varstore dump samples --head 3 --field meta.caption\n"
           "  varstore dump s3://bucket/docs --tail 2\n\n" + REMOTE_EPILOG)


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, NAME, run, help="print records", description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("path", type=store_path, help=STORE_HELP)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("-i", "--index", type=int, action="append", metavar="INDEX",
                       help="a record to print (repeatable); negative counts from the end")
    which.add_argument("--range", metavar="A:B",
                       help="records A (included) to B (excluded), clamped to the records there are, as in a Python "
                       "slice; negative values count from the end, either may be left out: --range -10: is the last 10")
    which.add_argument("--head", type=non_negative_int, metavar="N", help="the first N records (all, if fewer)")
    which.add_argument("--tail", type=non_negative_int, metavar="N", help="the last N records (all, if fewer)")
    parser.add_argument("--field", metavar="NAME",
                        help="msgpack records: print (or with --raw, write) only this field; a dotted path such as "
                        "meta.caption reaches into nested maps (a key holding a dot, such as \"a.b\", is found first)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--json", action="store_true",
                       help='one JSON object per line: {"index", "size", "record"}; bytes are {"$bytes": hex}, '
                       'arrays {"$array": {"dtype", "shape", "values"}}')
    style.add_argument("--raw", action="store_true",
                       help="write the exact payload bytes to stdout, back to back; with --field, that field's bytes "
                       "(bytes as they are, text as UTF-8, arrays as their raw values); stdout must be redirected "
                       "to a file or a pipe, not a terminal")
    parser.add_argument("--limit", type=non_negative_int, default=256, metavar="N",
                        help="show at most N bytes of a hex view, characters of text, elements of an array or "
                        "items of a list or map, each (default 256; 0 shows everything; --json and --raw print "
                        "records whole)")
    add_location_options(parser)


_RANGE_OPTION = "--range"


def join_negative_range(argv: list[str]) -> list[str]:
    """A ``dump`` command line `argv` with ``--range -3:`` written ``--range=-3:``: argparse takes a value that
    starts with '-' and is not a plain number for an option, so the slice form with a negative start needs joining
    to its option. Other commands, and the arguments after ``--`` (paths), are left as they are."""
    if argv[:1] != [NAME]:
        return argv
    joined: list[str] = []
    for position, argument in enumerate(argv):
        if argument == "--":
            return joined + argv[position:]
        if joined and joined[-1] == _RANGE_OPTION and argument.startswith("-") and ":" in argument:
            joined[-1] = f"{_RANGE_OPTION}={argument}"
        else:
            joined.append(argument)
    return joined


def _parse_range(text: str, count: int) -> range:
    """``A:B`` as Python slices it: negative bounds count from the end, bounds past either end are clamped."""
    start_text, separator, stop_text = text.partition(":")
    try:
        if not separator:
            raise ValueError
        start, stop = (int(part) if part.strip() else None for part in (start_text, stop_text))
    except ValueError:
        raise UsageError(f"--range takes A:B with integers A and B (either may be left out), not {text!r}") from None
    return range(count)[start:stop]


def _selected_indices(args: argparse.Namespace, count: int) -> np.ndarray | range:
    """The records the arguments ask for, checked against `count`, negatives resolved."""
    if args.index is not None:
        for index in args.index:
            if not -count <= index < count:
                raise UsageError(f"record {index} is out of range for {plural(count, 'record')} (valid: {-count} to {count - 1})")
        return np.array([index + count if index < 0 else index for index in args.index], np.int64)
    if args.range is not None:
        return _parse_range(args.range, count)
    if args.head is not None:
        return range(min(args.head, count))
    if args.tail is not None:
        return range(max(0, count - args.tail), count)
    return range(count)


def _chunks(indices: np.ndarray | range) -> Iterator[np.ndarray]:
    for start in range(0, len(indices), _CHUNK_RECORDS):
        yield np.asarray(indices[start : start + _CHUNK_RECORDS], np.int64)


def _payload_sizes(store: Store, indices: np.ndarray) -> list[int]:
    """The payload size in bytes of each record at `indices` (already checked), read from the index: the offsets,
    or a compressed shard's decoded sizes."""
    if not isinstance(store, ShardedReader):  # one shard, local or remote
        shards, local, readers = np.zeros(len(indices), np.int64), indices, {0: store}
    else:
        shards = np.searchsorted(store.shard_starts, indices, side="right") - 1
        local = indices - store.shard_starts[shards]
        readers = {int(shard): store.shard(int(shard)) for shard in np.unique(shards)}
    sizes = np.zeros(len(indices), np.int64)
    for shard, reader in readers.items():
        mask = shards == shard
        sizes[mask] = reader._index.payload_sizes(local[mask])
    return sizes.tolist()


def _write_raw(store: Store, indices: np.ndarray | range) -> None:
    output = sys.stdout.buffer
    for chunk in _chunks(indices):
        output.write(store.get_batch_flat(chunk).values.tobytes())
    output.flush()


def _field_bytes(value: Any, where: str) -> bytes:
    """What ``--raw`` writes of a field: bytes as they are, text as UTF-8, an array's values as stored."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tobytes()
    raise CommandError(f"{where}: the field holds {kind(value)}; --raw writes bytes, text or arrays only")


def _write_raw_fields(store: Store, indices: np.ndarray | range, field: str) -> None:
    output = sys.stdout.buffer
    for chunk in _chunks(indices):
        for index, record in zip(chunk.tolist(), store.get_batch(chunk)):
            where = f"{store.path}, record {index}"
            output.write(_field_bytes(field_value(record, field, where), where))
    output.flush()


def _render_value(value: Any, limit: int) -> tuple[str, str]:
    """(what a field value is, its text): shown by its type, as a whole record of its kind would be."""
    if isinstance(value, bytes):
        return plural(len(value), "byte"), hex_view(value, limit)
    if isinstance(value, str):
        return plural(len(value), "character"), render_text(value, limit)
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name} {tuple(value.shape)}", render_array(value, limit)
    return "null" if value is None else type(value).__name__, render_sample(value, limit)


def _describe_record(record: Any, size: int) -> str:
    if isinstance(record, np.ndarray):
        return f"{plural(size, 'byte')}, {record.dtype.name} {tuple(record.shape)}"
    if isinstance(record, str):
        return f"{plural(size, 'byte')}, {plural(len(record), 'character')}"
    return plural(size, "byte")


def _print_record(index: int, size: int, record: Any, codec: str, limit: int) -> None:
    print(f"record {index}: {_describe_record(record, size)}")
    if codec == "bytes":
        body = hex_view(record, limit)
    elif codec == "str":
        body = render_text(record, limit)
    elif codec == "ndarray":
        body = render_array(record, limit)
    else:
        body = render_sample(record, limit)
    if body:
        print(body)


def _print_field(index: int, field: str, value: Any, limit: int) -> None:
    description, body = _render_value(value, limit)
    print(f"record {index}, field {field}: {description}")
    print(body)


@contextmanager
def _room_for_the_deepest_records() -> Iterator[None]:
    """Let rendering recurse through the deepest records a writer accepts (msgpack, `MAX_DEPTH` levels)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + _FRAMES_PER_LEVEL * MAX_DEPTH)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _check_field(args: argparse.Namespace, store: Store) -> None:
    if args.field is not None and store.codec != "msgpack":
        raise UsageError(f"--field picks a field of structured (msgpack) records; {store.path} holds {store.codec} records")


def run(args: argparse.Namespace) -> int:
    if sys.stdout is None:  # started with its standard output closed (`varstore dump ... >&-`)
        raise CommandError("standard output is closed: there is nowhere to write the records")
    if args.raw and sys.stdout.isatty():
        raise UsageError("--raw writes binary data and standard output is a terminal; redirect it: "
                         "varstore dump ... --raw > FILE (or pipe it)")
    # A record of an intact shard prints though another shard is damaged; one of the damaged shard names the damage.
    with open_store(args.path, args, set_aside_damaged=True) as store, _room_for_the_deepest_records(), \
            writing_to_standard_output():
        indices = _selected_indices(args, len(store))
        _check_field(args, store)
        if args.raw:
            if args.field is None:
                _write_raw(store, indices)
            else:
                _write_raw_fields(store, indices, args.field)
            return 0
        for chunk in _chunks(indices):
            records = store.get_batch(chunk)
            for index, size, record in zip(chunk.tolist(), _payload_sizes(store, chunk), records):
                if args.field is not None:
                    record = field_value(record, args.field, f"{store.path}, record {index}")
                if args.json:
                    print_json({"index": index, "size": size, "record": to_json(record)})
                elif args.field is not None:
                    _print_field(index, args.field, record, args.limit)
                else:
                    _print_record(index, size, record, store.codec, args.limit)
        sys.stdout.flush()
    return 0
