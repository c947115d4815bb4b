"""Writers racing in real processes: a second writer of a dataset or shard is refused at once naming the holder,
a SIGKILLed writer leaves no stale lock, and two publishers that both pass the existence check never both win."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any, Callable

import pytest

import varstore
from varstore.local.locks import lock_directory
from varstore.local.publish import TEMP_MARK, temporary_path

from .helpers_reliability import assert_store_holds, make_records

FORK = multiprocessing.get_context("fork")
TIMEOUT = 20
RECORDS = make_records(21, 40)


def _run_child(connection: Any, work: Callable[[Any], Any]) -> None:  # pragma: no cover - the child
    try:
        result = work(connection)
        connection.send(("ok", result))
    except BaseException as error:  # reported to the parent, which fails the test
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()
        os._exit(0)


_children: list[Any] = []


@pytest.fixture(autouse=True)
def no_child_outlives_its_test() -> Any:
    yield
    while _children:
        process = _children.pop()
        if process.exitcode is None:
            process.kill()
            process.join(TIMEOUT)


class Child:
    """A forked process running `work(connection)`; it talks to the test through the connection."""

    def __init__(self, work: Callable[[Any], Any]) -> None:
        self.connection, child_end = FORK.Pipe()
        self.process = FORK.Process(target=_run_child, args=(child_end, work))
        self.process.start()
        _children.append(self.process)
        child_end.close()

    def receive(self) -> Any:
        assert self.connection.poll(TIMEOUT), "the child did not answer in time"
        return self.connection.recv()

    def send(self, message: Any) -> None:
        self.connection.send(message)

    def finish(self) -> Any:
        try:
            outcome = self.receive()
            self.process.join(TIMEOUT)
        finally:
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(TIMEOUT)
        assert self.process.exitcode == 0
        return outcome

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(TIMEOUT)
        assert self.process.exitcode == -signal.SIGKILL


# -- the first writer, alive in a child until told to finish ----------------------------------------------


def hold_sharded(directory: Path, **options: Any) -> Callable[[Any], Any]:
    def work(connection: Any) -> None:
        with varstore.ShardedWriter(directory, max_shard_records=7, **options) as writer:
            writer.extend(RECORDS[len(writer) :][:20])
            connection.send("ready")
            connection.recv()
            writer.extend(RECORDS[len(writer) :])

    return work


def hold_writer(prefix: Path) -> Callable[[Any], Any]:
    def work(connection: Any) -> None:
        with varstore.Writer(prefix, overwrite=True) as writer:
            writer.extend(RECORDS[:20])
            connection.send("ready")
            connection.recv()
            writer.extend(RECORDS[20:])

    return work


def hold_write_manifest(directory: Path) -> Callable[[Any], Any]:
    def work(connection: Any) -> None:
        import varstore.dataset.writer as sharded

        describe = sharded.describe_shard

        def describe_after_the_signal(*args: Any) -> Any:
            sharded.describe_shard = describe  # only the first shard waits
            connection.send("ready")
            connection.recv()
            return describe(*args)

        sharded.describe_shard = describe_after_the_signal
        varstore.write_manifest(directory, overwrite=True)

    return work


def interrupted(directory: Path) -> None:
    """A dataset whose writer died after two shards: what resume continues."""
    child = Child(hold_sharded(directory))
    assert child.receive() == "ready"
    child.kill()


FIRST_WRITERS = {
    "ShardedWriter": lambda directory: hold_sharded(directory),
    "ShardedWriter(resume)": lambda directory: hold_sharded(directory, resume=True),
    "ShardedWriter(overwrite)": lambda directory: hold_sharded(directory, overwrite=True),
    "write_manifest": hold_write_manifest,
}
SECOND_WRITERS: dict[str, Callable[[Path], Any]] = {
    "ShardedWriter": lambda directory: varstore.ShardedWriter(directory),
    "ShardedWriter(resume)": lambda directory: varstore.ShardedWriter(directory, resume=True),
    "ShardedWriter(overwrite)": lambda directory: varstore.ShardedWriter(directory, overwrite=True),
    "write_manifest": lambda directory: varstore.write_manifest(directory, overwrite=True),
}


def prepare(directory: Path, first: str) -> None:
    if first == "ShardedWriter(resume)":
        interrupted(directory)
    elif first in ("ShardedWriter(overwrite)", "write_manifest"):
        with varstore.ShardedWriter(directory, max_shard_records=7) as writer:
            writer.extend(RECORDS)


@pytest.mark.parametrize("second", list(SECOND_WRITERS))
@pytest.mark.parametrize("first", list(FIRST_WRITERS))
def test_second_dataset_writer_is_refused_at_once_while_the_first_lives(tmp_path, first, second):
    directory = tmp_path / "data"
    prepare(directory, first)
    child = Child(FIRST_WRITERS[first](directory))
    assert child.receive() == "ready"
    with pytest.raises(varstore.ConcurrentWriterError, match=rf"data.*pid {child.process.pid}\b"):
        SECOND_WRITERS[second](directory)
    child.send("go")
    assert child.finish() == ("ok", None)
    assert_store_holds(directory, RECORDS)
    assert not [name for name in os.listdir(directory) if TEMP_MARK in name or name.startswith(".varstore")]


@pytest.mark.parametrize("overwrite", [False, True])
def test_second_writer_of_one_shard_is_refused_at_once_while_the_first_lives(tmp_path, overwrite):
    child = Child(hold_writer(tmp_path / "docs"))
    assert child.receive() == "ready"
    with pytest.raises(varstore.ConcurrentWriterError, match=rf"docs.*pid {child.process.pid}\b"):
        varstore.Writer(tmp_path / "docs", overwrite=overwrite)
    child.send("go")
    assert child.finish() == ("ok", None)
    assert_store_holds(tmp_path / "docs", RECORDS)


def test_standalone_writer_cannot_take_the_shard_a_sharded_writer_is_writing(tmp_path):
    child = Child(hold_sharded(tmp_path))
    assert child.receive() == "ready"
    in_progress = sorted(name for name in os.listdir(tmp_path) if name.startswith("shard-") and name.endswith(".varstore-lock"))
    assert in_progress, "the shard in progress is locked"
    with pytest.raises(varstore.ConcurrentWriterError):
        varstore.Writer(tmp_path / in_progress[-1].removesuffix(".varstore-lock"), overwrite=True)
    assert varstore.remove_temporary_files(str(tmp_path)) == [], "a live writer's temporary files are kept"
    child.send("go")
    assert child.finish() == ("ok", None)
    assert_store_holds(tmp_path, RECORDS)


def hold_directory_with_a_temporary_copy(directory: Path) -> Callable[[Any], Any]:
    """What `varstore merge --copy` does: hold only the directory lock while copying a shard under a temporary name."""

    def work(connection: Any) -> None:
        with lock_directory(str(directory)):
            copy = temporary_path(str(directory / "shard-000000.data"))
            with open(copy, "wb") as file:
                file.write(b"copying")
            connection.send(copy)
            connection.recv()
            assert open(copy, "rb").read() == b"copying"
            os.unlink(copy)

    return work


def test_cleanup_leaves_every_temporary_file_alone_while_another_process_holds_the_directory_lock(tmp_path):
    """Regression (attack a05): `verify --remove-temporary` deleted a running merge's temporary copy, named like
    a shard temporary whose shard lock the merge (holding only the directory lock) does not take."""
    child = Child(hold_directory_with_a_temporary_copy(tmp_path))
    copy = child.receive()
    assert varstore.remove_temporary_files(str(tmp_path)) == []
    assert os.path.exists(copy)
    child.send("go")
    assert child.finish() == ("ok", None)


def test_cleanup_by_the_directory_lock_holder_spares_only_temporaries_of_locked_shards(tmp_path):
    leftover = temporary_path(str(tmp_path / "shard-000001.data"))
    open(leftover, "wb").close()
    with lock_directory(str(tmp_path)):
        with varstore.Writer(tmp_path / "shard-000000") as writer:
            writer.extend(RECORDS)
            assert varstore.remove_temporary_files(str(tmp_path), holding_directory_lock=True) == [leftover]
    assert_store_holds(tmp_path / "shard-000000", RECORDS)


@pytest.mark.parametrize("killed_writer", ["ShardedWriter", "Writer"])
def test_writer_killed_with_sigkill_leaves_no_stale_lock(tmp_path, killed_writer):
    if killed_writer == "Writer":
        child = Child(hold_writer(tmp_path / "docs"))
        assert child.receive() == "ready"
        child.kill()
        with varstore.Writer(tmp_path / "docs") as writer:
            writer.extend(RECORDS)
        assert_store_holds(tmp_path / "docs", RECORDS)
        varstore.remove_temporary_files(str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == ["docs.data", "docs.index"]
        return
    interrupted(tmp_path)
    with varstore.ShardedWriter(tmp_path, resume=True, max_shard_records=7) as writer:
        assert len(writer) == 14
        writer.extend(RECORDS[len(writer) :])
    assert_store_holds(tmp_path, RECORDS)


def publish_after_barrier(prefix: Path, records: list[bytes], barrier: Any) -> Callable[[Any], Any]:
    """A Writer with its lock disabled (as on a second machine) that waits for its rival right before its
    first naming call, after both have passed every existence check."""

    def work(connection: Any) -> str:
        import varstore.shard.writer

        varstore.shard.writer.lock_shard = lambda path: None
        originals = {name: getattr(os, name) for name in ("link", "replace")}

        def naming(name: str) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                if barrier is not None:
                    barrier.wait(TIMEOUT)
                for original_name, original in originals.items():
                    setattr(os, original_name, original)
                return originals[name](*args, **kwargs)

            return call

        for name in originals:
            setattr(os, name, naming(name))
        try:
            with varstore.Writer(prefix) as writer:
                writer.extend(records)
        except varstore.ShardExistsError:
            return "refused"
        return "won"

    return work


def test_two_publishers_past_the_existence_check_exactly_one_wins(tmp_path):
    versions = [make_records(31, 25), make_records(32, 30)]
    for round_number in range(4):
        prefix = tmp_path / f"round-{round_number}" / "docs"
        barrier = FORK.Barrier(2)
        children = [Child(publish_after_barrier(prefix, records, barrier)) for records in versions]
        outcomes = [child.finish() for child in children]
        assert sorted(outcomes) == [("ok", "refused"), ("ok", "won")], outcomes
        winner = versions[outcomes.index(("ok", "won"))]
        assert_store_holds(prefix, winner)
        assert sorted(os.listdir(prefix.parent)) == ["docs.data", "docs.index"]
