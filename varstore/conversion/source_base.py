"""What every source of ``varstore convert`` is (`Source`), and what the sources share: cutting an input into even
parts, appending a record with the place it was read named in the error, and reading a peer's ``index.json``."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..dataset.writer import ShardedWriter
from ..errors import CommandError, RecordTypeError
from ..progress import Counter


class Source:
    """A source file: the writer settings its records need, how much work there is, and the records.

    `split(count)` cuts the input into contiguous parts, each described by plain values, so that `write_part`
    can write each one in another process (the parts' records, in order, are those `write_to` writes).
    """

    codec = "bytes"
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    unit = "B"
    total: int | None = None
    metadata: dict[str, Any] = {}  # what the source adds to the dataset's metadata
    skipped = 0  # inputs left out on request (null fields with --skip-null)

    def write_to(self, writer: ShardedWriter, progress: Counter) -> None:
        """Write every record."""
        self.write_part(writer, progress, self.whole())

    def whole(self) -> dict[str, Any]:
        """The part that is the whole input."""
        return {"first": 0, "stop": None}

    def split(self, count: int) -> list[dict[str, Any]]:
        """At most `count` contiguous parts covering the input, in order (fewer when it has fewer records)."""
        raise NotImplementedError

    def write_part(self, writer: ShardedWriter, progress: Counter, part: dict[str, Any]) -> None:
        """Write the records of `part` (one of `split`'s, or `whole()`)."""
        raise NotImplementedError


def even_parts(count: int, units: int) -> list[dict[str, Any]]:
    """At most `count` parts {"first", "stop"} of `units` consecutive units, as equal as can be, none empty
    (one empty part when there is no unit)."""
    bounds = sorted({units * position // count for position in range(count + 1)})
    return [{"first": first, "stop": stop} for first, stop in zip(bounds, bounds[1:])] or [{"first": 0, "stop": 0}]


def append_record(writer: ShardedWriter, record: Any, where: str) -> None:
    """Append `record`, read at `where`; a record the codec refuses, or one too big for memory, is an error naming `where`."""
    try:
        writer.append(record)
    except RecordTypeError as error:
        raise CommandError(f"{where}: {error}") from None
    except MemoryError:
        raise CommandError(f"{where}: not enough memory to encode this record") from None


def check_claimed_count(path: str, claimed: int, claim: str) -> None:
    """Refuse an input whose header claims more records or rows than it has bytes: only a forged or absurd file does."""
    size = os.path.getsize(path)
    if claimed > size:
        raise CommandError(f"{path}: {claim} in a file of {size:,} bytes; convert refuses an input that claims "
                           "more records or rows than it has bytes")


def field_record(value: Any, codec: str, where: str) -> str | bytes:
    """A text (or, for the bytes codec, text or bytes) field value as the record for `codec`."""
    if isinstance(value, str):
        return value if codec == "str" else value.encode("utf-8")
    if isinstance(value, bytes) and codec == "bytes":
        return value
    expected = "text" if codec == "str" else "text or bytes"
    found = "null" if value is None else type(value).__name__
    hint = "; --skip-null leaves out the samples where it is null" if value is None else ""
    raise CommandError(f"{where}: the field holds {found}, expected {expected}{hint}")


INDEX_MAX_BYTES = 256 << 20  # far above any peer's index.json, and a bound on what parsing one may cost


def read_index_json(folder: str, kind: str) -> Any:
    """The parsed ``index.json`` of the `kind` folder (``"an MDS"``, ``"a litdata"``) at `folder`; missing, larger
    than `INDEX_MAX_BYTES` or not JSON, a `CommandError` naming it."""
    index_path = os.path.join(folder, "index.json")
    if not os.path.isfile(index_path):
        raise CommandError(f"{folder}: no index.json: not {kind} folder")
    if os.path.getsize(index_path) > INDEX_MAX_BYTES:
        raise CommandError(f"{index_path}: over {INDEX_MAX_BYTES >> 20} MiB, more than {kind} index holds")
    try:
        with open(index_path, encoding="utf-8") as file:
            return json.load(file)
    except (ValueError, RecursionError) as error:
        raise CommandError(f"{index_path}: not JSON: {error}") from None
