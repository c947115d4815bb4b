"""What the reliability tests share: records to write, reading a store every way, byte surgery on
index files, and wrappers that count, fail or crash at the operating-system calls a commit makes."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import signal
import struct
from typing import Any, Callable, Iterator

import numpy as np

import varstore
from varstore.format import header as fmt
from varstore.format.checksum import crc32c
from varstore.format.codecs import make_codec
from varstore.format.manifest import manifest_crc32c
from varstore.format.notation import to_json
from varstore.local.publish import TEMP_MARK

# The calls through which varstore's writers change files: where faults are injected and crashes happen.
COMMIT_CALLS = ("open", "write", "pwrite", "fsync", "replace", "link")

_HEADER_FIELDS = struct.Struct("<8sHHBBHQQQIII8sI")
_FIELD_POSITIONS = {
    name: position
    for position, name in enumerate(
        ("magic", "major", "minor", "codec", "reserved_byte", "flags", "record_count", "data_size", "metadata_size",
         "data_crc32c", "data_edge_crc32c", "body_crc32c", "reserved", "header_crc32c")
    )
}


def make_records(seed: int, count: int, max_size: int = 300) -> list[bytes]:
    """`count` payloads of random sizes in [0, max_size], some empty, all different enough to catch a swap."""
    generator = random.Random(seed)
    records = []
    for number in range(count):
        size = 0 if generator.random() < 0.1 else generator.randint(1, max_size)
        records.append(number.to_bytes(4, "little")[: min(size, 4)] + generator.randbytes(max(0, size - 4)))
    return records


def canonical(record: Any) -> Any:
    """A comparable form of any decoded record (arrays and bytes become plain JSON values)."""
    if isinstance(record, np.ndarray) and record.dtype == np.uint8 and record.ndim == 1:
        return {"$bytes": record.tobytes().hex()}
    return to_json(record)


def read_every_way(store: Any) -> list[Any]:
    """The records of a Reader or ShardedReader read one by one, as a batch, flat, as a slice and by
    iteration; fails unless all five agree. Returns them in canonical form."""
    count = len(store)
    one_by_one = [canonical(store[index]) for index in range(count)]
    assert [canonical(record) for record in store.get_batch(list(range(count)))] == one_by_one
    assert [canonical(record) for record in store[0:count]] == one_by_one
    assert [canonical(record) for record in store] == one_by_one
    flat = store.get_batch_flat(np.arange(count))
    assert len(flat.offsets) == count + 1
    if store.codec == "bytes":
        values = flat.values.tobytes()
        assert [{"$bytes": values[a:b].hex()} for a, b in zip(flat.offsets[:-1], flat.offsets[1:])] == one_by_one
    return one_by_one


def assert_store_holds(path: str | os.PathLike[str], records: list[Any]) -> None:
    """`path` opens, verifies, and every way of reading it gives exactly `records`."""
    with varstore.open(path) as store:
        store.verify()
        assert read_every_way(store) == [canonical(record) for record in records]


def final_index_names(directory: str | os.PathLike[str]) -> list[str]:
    """Shards committed in `directory`: names whose index file is under its final name."""
    return sorted(name[: -len(fmt.INDEX_SUFFIX)] for name in os.listdir(directory)
                  if name.endswith(fmt.INDEX_SUFFIX) and TEMP_MARK not in name)


def temporary_files(directory: str | os.PathLike[str]) -> list[str]:
    return sorted(name for name in os.listdir(directory) if TEMP_MARK in name)


# -- byte surgery ---------------------------------------------------------------------------------


def rewrite_header(index: bytes, **fields: Any) -> bytes:
    """`index` with header fields replaced (names as in `_FIELD_POSITIONS`) and the header CRC recomputed,
    so the damage reaches the checks behind the header's own checksum."""
    values = list(_HEADER_FIELDS.unpack_from(index))
    for name, value in fields.items():
        values[_FIELD_POSITIONS[name]] = value
    header = _HEADER_FIELDS.pack(*values)
    return header[:60] + struct.pack("<I", crc32c(header[:60])) + index[fmt.HEADER_SIZE :]


def reseal_body(index: bytes) -> bytes:
    """`index` with its body CRC (and so its header CRC) recomputed over its current bytes."""
    return rewrite_header(index, body_crc32c=crc32c(index[fmt.HEADER_SIZE :]))


def header_field(index: bytes, name: str) -> int:
    return _HEADER_FIELDS.unpack_from(index)[_FIELD_POSITIONS[name]]


def with_metadata(index: bytes, metadata: bytes) -> bytes:
    """`index` rebuilt around other metadata bytes, every size and CRC made consistent."""
    start = fmt.align8(fmt.HEADER_SIZE + header_field(index, "metadata_size"))
    padding = bytes(fmt.align8(fmt.HEADER_SIZE + len(metadata)) - fmt.HEADER_SIZE - len(metadata))
    rebuilt = index[: fmt.HEADER_SIZE] + metadata + padding + index[start:]
    return reseal_body(rewrite_header(rebuilt, metadata_size=len(metadata)))


def sealed_manifest(document: dict[str, Any]) -> bytes:
    """A forged manifest with its "crc32c" recomputed, so a reader gets past the checksum to the forged fields
    (left without one when the forgery has no canonical spelling: the JSON rules refuse it anyway)."""
    try:
        document = dict(document, crc32c=manifest_crc32c(document))
    except (varstore.FormatError, TypeError):
        document = {name: value for name, value in document.items() if name != "crc32c"}
    return json.dumps(document).encode()


def write_shard_files(prefix: str | os.PathLike[str], index: bytes, data: bytes) -> None:
    data_path, index_path = fmt.shard_paths(os.fspath(prefix))
    for path, content in ((index_path, index), (data_path, data)):
        with open(path, "wb") as file:
            file.write(content)


def read_shard_files(prefix: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(index bytes, data bytes) of a shard."""
    data_path, index_path = fmt.shard_paths(os.fspath(prefix))
    with open(index_path, "rb") as index, open(data_path, "rb") as data:
        return index.read(), data.read()


# -- operating-system calls -----------------------------------------------------------------------


class CallCounter:
    """Wraps the `os` functions named in `names`, numbering their calls together from 1 in `calls`.

    `on_call(number, name)` runs before each call and may raise or end the process.
    """

    def __init__(self, names: tuple[str, ...], on_call: Callable[[int, str], None] | None = None) -> None:
        self.names = names
        self.calls: list[str] = []
        self._on_call = on_call
        self._originals = {name: getattr(os, name) for name in names}

    def _wrap(self, name: str) -> Callable[..., Any]:
        original = self._originals[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self._on_call is not None:
                self._on_call(len(self.calls), name)
            return original(*args, **kwargs)

        return wrapper

    def install(self) -> None:
        for name in self.names:
            setattr(os, name, self._wrap(name))

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(os, name, original)

    def __enter__(self) -> "CallCounter":
        self.install()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()


def count_calls(work: Callable[[], None], names: tuple[str, ...] = COMMIT_CALLS) -> list[str]:
    """The names of the wrapped `os` calls `work` makes, in order."""
    with CallCounter(names) as counter:
        work()
    return counter.calls


@contextlib.contextmanager
def failing_call(name: str, nth: int, error_number: int) -> Iterator[CallCounter]:
    """Make the `nth` call of `os.<name>` raise OSError(`error_number`), as a full disk or a bad sector would."""
    seen = 0

    def on_call(_number: int, called: str) -> None:
        nonlocal seen
        if called == name:
            seen += 1
            if seen == nth:
                raise OSError(error_number, os.strerror(error_number))

    with CallCounter((name,), on_call) as counter:
        yield counter


FAULTS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


def run_killed_child(work: Callable[[], None], kill_before_call: int, names: tuple[str, ...] = COMMIT_CALLS) -> int:
    """Fork a child that runs `work` and SIGKILLs itself just before its `kill_before_call`-th wrapped
    `os` call (never, if it makes fewer). Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            def on_call(number: int, _name: str) -> None:
                if number == kill_before_call:
                    os.kill(os.getpid(), signal.SIGKILL)

            CallCounter(names, on_call).install()
            work()
        except BaseException:  # an exception in the child is a test failure: exit code 3 says so
            import traceback

            traceback.print_exc()
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def exited_cleanly(status: int) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# -- reading untrusted files ----------------------------------------------------------------------


def _attempt(operation: Callable[[], Any]) -> Any:
    """The result of `operation`, or the VarstoreError it raised; any other exception propagates."""
    try:
        return operation()
    except varstore.VarstoreError as error:
        return error


def _failed(result: Any) -> bool:
    return isinstance(result, varstore.VarstoreError)


def _flat_records(batch: Any) -> list[bytes]:
    """The payload bytes of each record of a FlatBatch (offsets count rows for ndarray shards, else bytes)."""
    offsets = np.asarray(batch.offsets).tolist()
    return [batch.values[start:end].tobytes() for start, end in zip(offsets[:-1], offsets[1:])]


def _flat_iteration(store: Any, count: int) -> list[bytes]:
    """The payload bytes of the first `count` records, read with iter_flat in batches of 3."""
    records: list[bytes] = []
    for batch in store.iter_flat(3):
        records += _flat_records(batch)
        if len(records) >= count:
            break
    return records[:count]


def exercise_store(path: str | os.PathLike[str], *, verify_reads: bool = False, max_records: int = 64) -> dict[str, Any]:
    """Open `path` and try every kind of read on it: single (forwards and backwards), batch, flat, slice,
    iteration, flat iteration, record sizes, verify (and as_array with the offsets, for ndarray shards).

    Each outcome is a result or a VarstoreError; any other exception escapes to fail the caller. Returns
    {"open": ...} plus one entry per operation; "single" maps each of the first `max_records` indices to its
    outcome; flat reads are lists of payload bytes per record.
    """
    store = _attempt(lambda: varstore.open(path, verify_reads=verify_reads))
    outcomes: dict[str, Any] = {"open": store}
    if _failed(store):
        return outcomes
    with store:
        count = min(len(store), max_records)
        everything = list(range(count))
        outcomes["length"] = len(store)
        outcomes["codec"] = store.codec
        outcomes["single"] = {index: _attempt(lambda: store[index]) for index in everything}
        outcomes["single_negative"] = _attempt(lambda: store[-1]) if len(store) else None
        outcomes["batch"] = _attempt(lambda: store.get_batch(everything))
        outcomes["batch_reversed"] = _attempt(lambda: store.get_batch(everything[::-1]))
        outcomes["flat"] = _attempt(lambda: _flat_records(store.get_batch_flat(everything)))
        outcomes["slice"] = _attempt(lambda: store[0:count])
        outcomes["step_slice"] = _attempt(lambda: store[0:count:2])
        outcomes["iteration"] = _attempt(lambda: list(itertools.islice(store, count)))
        outcomes["flat_iteration"] = _attempt(lambda: _flat_iteration(store, count))
        outcomes["record_sizes"] = _attempt(lambda: store.record_sizes())
        if store.codec == "ndarray" and isinstance(store, varstore.Reader):
            outcomes["as_array"] = _attempt(store.as_array)
            outcomes["offsets"] = np.array(store.offsets[: count + 1], np.uint64)
            outcomes["row_size"] = store.dtype.itemsize * int(np.prod(store.shape or ()))
        outcomes["verify"] = _attempt(store.verify)
    return outcomes


def _payload(record: Any, codec: str) -> bytes:
    """The stored bytes of a record of the bytes, str or ndarray codec: what a flat read of it returns."""
    if codec == "str":
        return record.encode("utf-8")
    if codec == "ndarray":
        return record.tobytes()
    return bytes(record)


def _agrees_with_single(payload: bytes, single: Any, codec: str) -> bool:
    """Whether a flat read's payload holds `single`; msgpack payloads are decoded, as re-encoding a record
    need not give the bytes stored."""
    if codec != "msgpack":
        return payload == _payload(single, codec)
    try:
        return canonical(make_codec("msgpack").decode(payload, 0, len(payload))) == canonical(single)
    except (ValueError, TypeError):  # how the codec refuses a payload (readers wrap it in a VarstoreError)
        return False


def assert_reads_agree(outcomes: dict[str, Any]) -> None:
    """Every way of reading gives the same records. A batch or slice succeeds only if every single read of its
    records does, and then returns exactly those; iteration, flat reads, flat iteration,
    record sizes and as_array either raise a VarstoreError or agree with every record read one by one."""
    singles = outcomes.get("single")
    if singles is None:
        return
    indices, codec = list(singles), outcomes["codec"]
    expected = [None if _failed(singles[index]) else canonical(singles[index]) for index in indices]
    every_record_seen = outcomes["length"] == len(indices)
    for name, order in (("batch", indices), ("batch_reversed", indices[::-1]), ("slice", indices),
                        ("step_slice", indices[::2])):
        result = outcomes[name]
        wanted = [expected[index] for index in order]
        if _failed(result):
            assert None in wanted, f"{name} failed ({result}) where every single read succeeded"
        else:
            assert [canonical(record) for record in result] == wanted, f"{name} disagrees with single reads"
    # Whole-store reads (iteration, flat, sizes, as_array) may also refuse damage outside the records read
    # one by one (e.g. a shard holding none of them): a VarstoreError, or the same records.
    if not _failed(outcomes["iteration"]):
        assert [canonical(record) for record in outcomes["iteration"]] == expected, "iteration disagrees with single reads"
    if every_record_seen and indices:
        last, negative = singles[indices[-1]], outcomes["single_negative"]
        assert _failed(negative) == _failed(last), "store[-1] and store[len - 1] disagree"
        if not _failed(negative):
            assert canonical(negative) == canonical(last), "store[-1] and store[len - 1] disagree"
    flat_sizes = None
    for name in ("flat", "flat_iteration"):
        result = outcomes[name]
        if _failed(result):
            continue
        assert len(result) == len(indices), f"{name} returned {len(result)} records for {len(indices)}"
        for index, payload in zip(indices, result):
            if not _failed(singles[index]):
                assert _agrees_with_single(payload, singles[index], codec), f"{name} record {index} disagrees"
        flat_sizes = [len(payload) for payload in result]
    sizes = outcomes["record_sizes"]
    if not _failed(sizes):
        assert len(sizes) == outcomes["length"]
        sizes = sizes[: len(indices)].tolist()
        if flat_sizes is not None:
            assert sizes == flat_sizes, "record_sizes disagree with the flat reads"
        for index in indices:
            if not _failed(singles[index]) and codec != "msgpack":
                assert sizes[index] == len(_payload(singles[index], codec)), f"record_sizes[{index}] disagrees"
    if "as_array" in outcomes:
        _assert_array_agrees(outcomes, singles)


def _assert_array_agrees(outcomes: dict[str, Any], singles: dict[int, Any]) -> None:
    """as_array (the data file as rows) holds each record read at its offsets."""
    rows, offsets, row_size = outcomes["as_array"], outcomes["offsets"].tolist(), outcomes["row_size"]
    if _failed(rows):
        return
    for index, result in singles.items():
        if not _failed(result):
            start, end = offsets[index] // row_size, offsets[index + 1] // row_size
            assert np.array_equal(rows[start:end], result), f"as_array disagrees with record {index}"


def assert_reads_match(outcomes: dict[str, Any], original: list[Any], *, checked: bool) -> None:
    """Damage never changes a record silently: with `checked` (verify_reads) every successful read of any
    kind is the original record, and whenever verify() passes, so is every record read and the sizes."""
    singles = outcomes.get("single")
    verified = "verify" in outcomes and not _failed(outcomes["verify"])
    if singles is None or not (checked or verified):
        return
    assert len(singles) <= len(original)
    codec = outcomes["codec"]
    wanted = [canonical(record) for record in original[: len(singles)]]
    for index, result in singles.items():
        if not _failed(result):
            assert canonical(result) == wanted[index], f"record {index} changed silently"
    for name in ("batch", "slice", "iteration"):
        if not _failed(outcomes[name]):
            assert [canonical(record) for record in outcomes[name]] == wanted, f"{name} changed records silently"
    for name in ("flat", "flat_iteration"):
        if not _failed(outcomes[name]):
            for index, payload in enumerate(outcomes[name]):
                assert _agrees_with_single(payload, original[index], codec), f"{name} record {index} changed silently"
    if verified:
        assert len(original) == outcomes["length"], "verify passed on a shard with another record count"
        if not _failed(outcomes["record_sizes"]) and codec != "msgpack":
            assert outcomes["record_sizes"].tolist() == [len(_payload(record, codec)) for record in original]
        if "as_array" in outcomes and not _failed(outcomes["as_array"]):
            assert np.array_equal(outcomes["as_array"], np.concatenate(original)), "as_array changed silently"
