"""docs/guarantees.md, "One writer per dataset and per shard": the refused writer learns who holds the lock, by pid
and host, whether the holder is this process or another."""

from __future__ import annotations

import multiprocessing
import os
import re
import socket

import pytest

import varstore

FORK = multiprocessing.get_context("fork")


def _hold_writer(directory: str, ready, release) -> None:
    with varstore.ShardedWriter(directory) as writer:
        writer.append(b"held")
        ready.send("held")
        release.recv()


def test_a_refused_writer_names_the_holders_pid_and_host_in_this_process_and_another(tmp_path):
    holder = re.escape(f"pid {os.getpid()} on {socket.gethostname()}")
    with varstore.Writer(tmp_path / "docs"), pytest.raises(varstore.ConcurrentWriterError, match=rf"docs.*{holder}\b"):
        varstore.Writer(tmp_path / "docs")
    with varstore.ShardedWriter(tmp_path / "data"), pytest.raises(varstore.ConcurrentWriterError, match=rf"data.*{holder}\b"):
        varstore.ShardedWriter(tmp_path / "data", overwrite=True)

    ready, ready_child = FORK.Pipe()
    release_child, release = FORK.Pipe()
    child = FORK.Process(target=_hold_writer, args=(str(tmp_path / "other"), ready_child, release_child))
    child.start()
    try:
        assert ready.poll(120) and ready.recv() == "held"
        with pytest.raises(varstore.ConcurrentWriterError, match=rf"other.*pid {child.pid} on {re.escape(socket.gethostname())}\b"):
            varstore.ShardedWriter(tmp_path / "other", overwrite=True)
        release.send("go")
        child.join(120)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(120)
    assert list(varstore.open(tmp_path / "other")) == [b"held"]


def _close_in_a_forked_child(writer) -> int:
    """Exit status of a forked child that calls `writer.close()`: 0 if the close was refused as a forked process's."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            writer.close()
        except varstore.VarstoreError as error:
            code = 0 if "forked process" in str(error) else 2
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def test_a_forked_child_cannot_commit_its_parents_dataset_writer_before_its_first_record(tmp_path):
    with varstore.ShardedWriter(tmp_path / "data") as writer:  # no shard in progress: only the writer itself can refuse
        assert _close_in_a_forked_child(writer) == 0
        assert not (tmp_path / "data" / "manifest.json").exists()
        writer.append(b"parent's")
    assert list(varstore.open(tmp_path / "data")) == [b"parent's"]
