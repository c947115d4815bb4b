"""The writer journal: which shards a `ShardedWriter` run began and committed, so a resume adopts only its own.

``DIR/.varstore-journal`` is writer state, not part of a dataset, and readers
ignore it (its hidden name is not a valid shard name). Its first line describes
the run: a random run id, the codec, and which manifest the run replaces (the
CRC32C of that manifest's bytes; null for a new dataset). Each further line says
that a shard name was begun, or that a shard was committed with a given manifest
entry. Lines are appended and fsynced; each carries its own CRC32C, so a line
torn by a crash (and everything after it) is ignored. A new run starts a new
journal, and a resume replaces the journal by a new file holding exactly its
valid lines before appending (never appending after a torn line, nor through a
hard link shared with a snapshot); the run's manifest commit ends it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import FormatError, RecordTypeError
from ..format import manifest
from ..format.checksum import crc32c
from ..format.manifest import MANIFEST_NAME, ShardEntry, is_valid_shard_name
from .publish import fsync_directory, remove_quietly, temporary_path, write_all

JOURNAL_NAME = ".varstore-journal"
_JOURNAL_FORMAT = "varstore-writer-journal"


@dataclass
class Run:
    """What a journal says about the run that wrote it."""

    run_id: str
    codec: str
    codec_params: dict[str, Any]
    replaces: int | None
    begun: list[str] = field(default_factory=list)
    committed: dict[str, ShardEntry] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {"journal": _JOURNAL_FORMAT, "run": self.run_id, "codec": {"name": self.codec, "params": self.codec_params},
                "replaces": self.replaces}


def new_run(codec: str, codec_params: dict[str, Any], replaces: int | None) -> Run:
    return Run(secrets.token_hex(8), codec, codec_params, replaces)


def journal_path(directory: str) -> str:
    return os.path.join(directory, JOURNAL_NAME)


def manifest_identity(directory: str) -> int | None:
    """CRC32C of the bytes of ``manifest.json`` (valid or not), or None when there is none: which version is live."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # a symbolic link, which no reader opens (§3)
            return -1
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return -1
        return crc32c(os.pread(fd, manifest.MAX_MANIFEST_SIZE + 1, 0))
    finally:
        os.close(fd)


def _line(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, sort_keys=True, separators=(",", ":")).encode("ascii")
    return b"%08x %s\n" % (crc32c(text), text)


def _parse_line(line: bytes) -> dict[str, Any] | None:
    checksum, _, text = line.partition(b" ")
    try:
        if len(checksum) != 8 or int(checksum, 16) != crc32c(text):
            return None
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def max_journal_size() -> int:
    """A run's journal lines per shard are smaller than twice its manifest entry, so a larger journal is no writer's."""
    return 2 * manifest.MAX_MANIFEST_SIZE


def read_journal(directory: str) -> Run | None:
    """The run the journal in `directory` describes, or None when there is none (or its first line is torn)."""
    path = journal_path(directory)
    try:
        # Non-blocking, and regular files only: a FIFO planted here must not hang a writer holding the lock.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise FormatError("the writer journal is not a regular file; remove it", path=path)
            size = info.st_size
            if size > max_journal_size():
                raise FormatError(
                    f"the writer journal is {size} bytes, over the limit of {max_journal_size()}: no writer wrote it; "
                    "remove it and write the dataset again with overwrite=True",
                    path=path,
                )
            raw = file.read(size)
    except FileNotFoundError:
        return None
    lines = raw.split(b"\n")[:-1]  # what follows the last newline is a torn append
    header = _parse_line(lines[0]) if lines else None
    codec = header.get("codec") if header else None
    if not header or header.get("journal") != _JOURNAL_FORMAT or not isinstance(codec, dict):
        return None
    run = Run(str(header.get("run")), str(codec.get("name")), dict(codec.get("params") or {}), header.get("replaces"))
    begun: set[str] = set()
    for line in lines[1:]:
        record = _parse_line(line)
        if record is None or not _add_record(run, record, begun):
            break
    return run


def _add_record(run: Run, record: dict[str, Any], begun: set[str]) -> bool:
    """Add one journal line to `run` (`begun` is the set of ``run.begun``); False for a line no writer wrote."""
    if "begun" in record and is_valid_shard_name(record["begun"]):
        if record["begun"] not in begun:
            begun.add(record["begun"])
            run.begun.append(record["begun"])
        return True
    committed = record.get("committed")
    if isinstance(committed, dict) and is_valid_shard_name(committed.get("name")):
        try:
            run.committed[committed["name"]] = ShardEntry(**committed)
        except TypeError:
            return False
        return True
    return False


class Journal:
    """The open journal of a live run: `start` (or `continue_run`), `record` after each shard, `remove` at the end."""

    def __init__(self, directory: str, fd: int) -> None:
        self._path = journal_path(directory)
        self._fd = fd

    @classmethod
    def start(cls, directory: str, run: Run) -> "Journal":
        """Replace any journal in `directory` by one for `run` (with its begun and committed shards), atomically and durably."""
        lines = [_line(run.header())]
        lines += [_line({"committed": asdict(run.committed[name])}) for name in run.begun if name in run.committed]
        lines += [_line({"begun": name}) for name in run.begun]
        final = journal_path(directory)
        temporary = temporary_path(final)
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, b"".join(lines))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, final)
        except OSError:
            remove_quietly([temporary])
            raise
        try:
            fsync_directory(directory)
            return cls.continue_run(directory)
        except OSError:
            remove_quietly([final])  # a run that cannot start leaves nothing to resume
            raise

    @classmethod
    def continue_run(cls, directory: str) -> "Journal":
        return cls(directory, os.open(journal_path(directory), os.O_WRONLY | os.O_APPEND))

    def record(self, committed: ShardEntry | None, begun: str | None) -> None:
        """Append (and fsync) that a shard was committed and/or that the next one is begun."""
        lines = ([_line({"committed": asdict(committed)})] if committed else []) + ([_line({"begun": begun})] if begun else [])
        write_all(self._fd, b"".join(lines))
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def remove(self) -> None:
        """End the run: its manifest is committed (or it was aborted), so nothing is left to resume."""
        self.close()
        remove_quietly([self._path])

    def __del__(self) -> None:
        self.close()


def check_codec(run: Run, codec: str, codec_params: dict[str, Any], directory: str) -> None:
    if (run.codec, run.codec_params) != (codec, codec_params):
        raise RecordTypeError(
            f"cannot resume: the interrupted run stores codec {run.codec} {run.codec_params}, "
            f"this writer was given {codec} {codec_params}",
            path=directory,
        )
