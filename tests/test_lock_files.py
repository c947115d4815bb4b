"""Lock files that are not what a writer left: a symlink or FIFO planted at a lock path is refused (never followed,
never waited on), another user's stale lock file still locks, a probe never refuses a writer, and a lock is let go
only by the process that took it and only if its path still names the file it locked."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

import varstore
from varstore.local import locks as locking
from varstore.local.locks import directory_lock_path, is_locked, lock_directory, shard_lock_path
from varstore.local.publish import TEMP_MARK

TIMEOUT = 20


@pytest.mark.parametrize("writer", ["ShardedWriter", "Writer"])
def test_symlink_at_a_lock_path_is_refused_and_its_target_kept(tmp_path, writer):
    """Regression (attack a02): the lock was opened through the symlink and its target truncated."""
    victim = tmp_path / "precious.txt"
    victim.write_text("important\n" * 100)
    lock = directory_lock_path(str(tmp_path / "ds")) if writer == "ShardedWriter" else shard_lock_path(str(tmp_path / "docs"))
    os.makedirs(tmp_path / "ds")
    os.symlink(victim, lock)
    with pytest.raises(varstore.StorageError, match="symbolic link") as refusal:
        if writer == "ShardedWriter":
            varstore.ShardedWriter(tmp_path / "ds")
        else:
            varstore.Writer(tmp_path / "docs")
    assert refusal.value.path == lock
    assert victim.read_text() == "important\n" * 100
    with pytest.raises(varstore.StorageError, match="symbolic link"):
        is_locked(lock)


def test_dangling_symlink_at_a_lock_path_creates_nothing(tmp_path):
    os.symlink(tmp_path / "created-through-the-link", tmp_path / "docs.varstore-lock")
    with pytest.raises(varstore.StorageError, match="symbolic link"):
        varstore.Writer(tmp_path / "docs")
    assert not (tmp_path / "created-through-the-link").exists()


def test_fifo_at_a_lock_path_is_refused_without_hanging(tmp_path):
    """Regression (attack a03): opening a FIFO lock file blocked is_locked (and verify --remove-temporary) forever."""
    lock = shard_lock_path(str(tmp_path / "docs"))
    os.mkfifo(lock)
    (tmp_path / ("docs.data" + TEMP_MARK + "abcdef012345")).touch()
    probe = (
        "import varstore\n"
        "from varstore.local.locks import is_locked\n"
        "for attempt in (lambda: is_locked(%r), lambda: varstore.Writer(%r), lambda: varstore.remove_temporary_files(%r)):\n"
        "    try:\n"
        "        attempt()\n"
        "    except varstore.StorageError as error:\n"
        "        print(error)\n"
    ) % (lock, str(tmp_path / "docs"), str(tmp_path))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{lock}: the writer lock is not a regular file; remove it if no writer is running"] * 3


def test_dead_writers_lock_file_of_another_user_still_locks_for_this_one(tmp_path):
    """Regression (attack a14): a stale 0644 lock file owned by another user made every writer fail with
    "Permission denied", although flock needs only a read-only descriptor."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a writer as another user")
    shared = tempfile.mkdtemp(dir="/tmp")  # tmp_path's parents are private to root
    try:
        os.chmod(shared, 0o777)
        with open(directory_lock_path(shared), "w") as stale:
            stale.write("pid 1 on elsewhere\n")
        os.chmod(directory_lock_path(shared), 0o644)
        nobody = 65534
        code = (
            "import varstore, varstore.local.locks as locking\n"
            "with varstore.ShardedWriter(%r) as writer:\n"
            "    writer.append(b'mine')\n"
            "    try:\n"
            "        locking.lock_directory(%r)\n"
            "    except varstore.ConcurrentWriterError:\n"
            "        print('locked')\n"
        ) % (shared, shared)
        done = subprocess.run([sys.executable, "-c", code], user=nobody, group=nobody, extra_groups=[],
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "locked", "the read-only lock excludes a second writer"
        with varstore.open(shared) as dataset:
            assert list(dataset) == [b"mine"]
    finally:
        shutil.rmtree(shared)


def test_lock_file_that_cannot_be_opened_for_writing_is_locked_read_only(tmp_path, monkeypatch):
    """The same fallback without root: opening read-write is refused as for another user's file."""
    path = directory_lock_path(str(tmp_path))
    with open(path, "w") as stale:
        stale.write("pid 1 on elsewhere\n")
    real_open = os.open

    def refuse_writing(file: Any, flags: int, *args: Any) -> int:
        if file == path and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        return real_open(file, flags, *args)

    monkeypatch.setattr(os, "open", refuse_writing)
    with lock_directory(str(tmp_path)) as lock:
        assert lock.held and is_locked(path)
        with pytest.raises(varstore.ConcurrentWriterError):
            lock_directory(str(tmp_path))
    assert not os.path.exists(path)


def test_writer_starts_past_probes_that_hold_the_lock_file_shared(tmp_path, monkeypatch):
    """Regression (attack a22): `is_locked` probes (shared locks held for microseconds) from busy cleanup or
    monitoring made a starting writer fail with ConcurrentWriterError after three tries; while a shared lock
    can be had no writer holds the file, so the writer keeps trying."""
    real_flock = fcntl.flock
    probed = {"times": 0}

    def flock_under_probes(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX | fcntl.LOCK_NB and probed["times"] < 50:
            probed["times"] += 1
            raise BlockingIOError(errno.EWOULDBLOCK, "a probe holds it shared")
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_under_probes)
    with varstore.ShardedWriter(tmp_path) as writer:
        writer.append(b"x")
    assert probed["times"] == 50


def test_live_writer_is_refused_without_waiting_out_the_probe_retries(tmp_path, monkeypatch):
    attempts = {"exclusive": 0}
    real_flock = fcntl.flock

    def counting_flock(fd: int, operation: int) -> None:
        attempts["exclusive"] += operation == fcntl.LOCK_EX | fcntl.LOCK_NB
        real_flock(fd, operation)

    with lock_directory(str(tmp_path)):
        monkeypatch.setattr(fcntl, "flock", counting_flock)
        with pytest.raises(varstore.ConcurrentWriterError, match=f"pid {os.getpid()}"):
            lock_directory(str(tmp_path))
    assert attempts["exclusive"] == 1


def test_release_leaves_a_lock_file_that_replaced_its_own(tmp_path):
    """A holder whose lock file was unlinked and re-created by the next writer must not unlink the new one."""
    first = lock_directory(str(tmp_path))
    os.unlink(first.path)
    with lock_directory(str(tmp_path)) as second:
        first.release()
        assert os.path.exists(second.path) and is_locked(second.path)
        with pytest.raises(varstore.ConcurrentWriterError):
            lock_directory(str(tmp_path))


FORKED_CHILD_EXITS = """
import os, sys, varstore
from varstore.local.locks import lock_directory
directory = sys.argv[1]
writer = varstore.ShardedWriter(directory, max_shard_records=100)
writer.extend([b"before"] * 10)
before = sorted(os.listdir(directory))
pid = os.fork()
if pid == 0:
    sys.exit(0)  # an ordinary exit: the inherited writer's finalizers run in the child
os.waitpid(pid, 0)
assert sorted(os.listdir(directory)) == before, (before, sorted(os.listdir(directory)))
try:
    lock_directory(directory)
    raise AssertionError("a second writer took the lock after the child exited")
except varstore.ConcurrentWriterError:
    pass
writer.extend([b"after"] * 10)
writer.close()
print(len(varstore.open(directory)))
"""


def test_forked_child_exit_leaves_the_parents_lock_and_temporary_files(tmp_path):
    """Regression (attack a04): a forked child's finalizers (Writer, WriterLock, ShardedWriter) unlinked the
    parent's lock files and deleted its temporary shard files: a second writer was admitted, the commit failed."""
    done = subprocess.run([sys.executable, "-c", FORKED_CHILD_EXITS, str(tmp_path)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "20"


def _in_a_forked_child(check) -> int:
    """Run `check()` in a forked child that exits without pytest's clean-up; returns its exit status (0: it held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check()
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def _child_leaves_the_with_block_and_cannot_commit(writer) -> None:
    writer.__exit__(SystemExit, SystemExit(0), None)  # what `sys.exit()` inside the inherited `with` does
    try:
        writer.close()
    except varstore.VarstoreError as error:
        assert "forked process" in str(error)
    else:
        raise AssertionError("a forked child committed its parent's writer")


def test_forked_child_leaving_the_with_block_leaves_the_parents_dataset_writer_alone(tmp_path):
    records = [bytes([index]) * 10 for index in range(30)]
    with varstore.ShardedWriter(tmp_path / "data", max_shard_records=10) as writer:
        writer.extend(records[:25])
        assert _in_a_forked_child(lambda: _child_leaves_the_with_block_and_cannot_commit(writer)) == 0
        writer.extend(records[25:])
    assert list(varstore.open(tmp_path / "data")) == records


def test_forked_child_leaving_the_with_block_leaves_the_parents_shard_writer_alone(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend([b"a", b"b"])
        assert _in_a_forked_child(lambda: _child_leaves_the_with_block_and_cannot_commit(writer)) == 0
        writer.append(b"c")
    assert list(varstore.open(tmp_path / "docs")) == [b"a", b"b", b"c"]


def test_a_forked_child_that_outlives_its_killed_parent_does_not_keep_the_lock(tmp_path):
    """The lock dies with the writer that took it, not with the last process holding a copy of its descriptor."""
    script = (
        "import os, sys, varstore\n"
        f"writer = varstore.ShardedWriter({str(tmp_path / 'data')!r}, max_shard_records=2)\n"
        "writer.extend([b'a', b'b', b'c'])\n"
        "if os.fork() == 0:\n"
        "    os.write(1, b'child\\n')  # running Python code: past the fork handlers\n"
        "    sys.stdin.read()  # the child lives until the test closes its standard input\n"
        "    os._exit(0)\n"
        "os.write(1, b'parent\\n')\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as writer:
        try:
            assert sorted([writer.stdout.readline(), writer.stdout.readline()]) == [b"child\n", b"parent\n"]
            writer.kill()
            writer.wait(timeout=30)
            with varstore.ShardedWriter(tmp_path / "data", max_shard_records=2, resume=True) as resumed:
                assert len(resumed) == 2
                resumed.append(b"c")
        finally:
            writer.stdin.close()  # ends the child too
    assert list(varstore.open(tmp_path / "data")) == [b"a", b"b", b"c"]


def test_cleanup_skips_temporary_files_it_may_not_remove_and_the_writer_starts(tmp_path, monkeypatch):
    """In a sticky shared directory another user's leftovers cannot be unlinked: a new writer goes on anyway."""
    pid = os.fork()
    if pid == 0:  # a writer killed with a committed shard and the temporary files of the next
        try:
            writer = varstore.ShardedWriter(tmp_path, max_shard_records=2)
            writer.extend([b"a"] * 3)
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    leftovers = sorted(name for name in os.listdir(tmp_path) if TEMP_MARK in name)
    assert leftovers
    real_unlink = os.unlink

    def not_permitted(path, *args, **options):
        if TEMP_MARK in os.fspath(path):
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *args, **options)

    monkeypatch.setattr(os, "unlink", not_permitted)
    with varstore.ShardedWriter(tmp_path, max_shard_records=2, overwrite=True) as writer:
        writer.extend([b"b"] * 3)
    monkeypatch.undo()
    assert list(varstore.open(tmp_path)) == [b"b"] * 3
    assert {str(tmp_path / name) for name in leftovers} <= set(varstore.remove_temporary_files(str(tmp_path)))


def test_interrupt_right_after_open_created_the_lock_file_leaves_no_lock_file(tmp_path, monkeypatch):
    """Ctrl-C can land after `open` created the file but before its descriptor is kept: the file goes anyway."""
    real_open, calls = os.open, []

    def open_then_interrupt(path, flags, *args):
        fd = real_open(path, flags, *args)
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(locking.os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        varstore.Writer(str(tmp_path / "shard"))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_interrupt_while_the_next_shard_is_journaled_leaves_no_lock_file(tmp_path, monkeypatch):
    """The shard a dataset writer has begun but not yet journaled is abandoned with its lock on Ctrl-C."""
    writer = varstore.ShardedWriter(tmp_path / "data", max_shard_records=1)
    writer.append(b"first")
    monkeypatch.setattr(writer._journal, "record", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt) as caught:  # its traceback keeps the frames, as a CLI's handler would
        writer.append(b"second")
    writer.abort()
    assert [name for name in os.listdir(tmp_path / "data") if name.endswith(".varstore-lock")] == []
    del caught
