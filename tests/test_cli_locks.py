"""The command line and the single-writer lock: convert and merge lock their destination; verify spares a running writer.

Each test runs the console script in a process of its own, against a lock held
here or against another console script, so the lock is exercised across processes.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import varstore
from varstore.local.locks import DIRECTORY_LOCK_NAME, lock_directory
from varstore.local.publish import TEMP_MARK

from .helpers_cli import CONSOLE_SCRIPT, assert_one_line_error, run_script, strict_json, write_dataset

LINES = [f"line {index}" for index in range(50)]


@pytest.fixture
def sources(tmp_path):
    """The arguments that give `convert` and `merge` each a source of the 50 LINES."""
    (tmp_path / "lines.txt").write_text("".join(line + "\n" for line in LINES))
    dataset = write_dataset(tmp_path / "parts", LINES, codec="str", max_shard_records=20)
    return {"convert": [tmp_path / "lines.txt"], "merge": [dataset]}


def _assert_complete(destination) -> None:
    verified = run_script("verify", destination)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert list(varstore.open(destination)) == LINES


@pytest.mark.parametrize("command", ["convert", "merge"])
def test_second_writer_is_refused_naming_the_holder_then_runs_once_released(tmp_path, sources, command):
    destination = tmp_path / "out"
    destination.mkdir()
    with lock_directory(str(destination)):
        refused = run_script(command, *sources[command], destination)
        assert refused.returncode == 1
        assert_one_line_error(refused.returncode, refused.stderr.decode(), f"varstore {command}: ", str(destination),
                              "another writer", f"pid {os.getpid()}")
        assert os.listdir(destination) == [DIRECTORY_LOCK_NAME]  # nothing written, nothing of the holder's removed
    done = run_script(command, *sources[command], destination)
    assert done.returncode == 0, done.stderr
    _assert_complete(destination)
    assert DIRECTORY_LOCK_NAME not in os.listdir(destination)


@pytest.mark.parametrize("command", ["convert", "merge"])
def test_two_commands_racing_into_one_destination_give_one_whole_dataset(tmp_path, sources, command):
    destination = tmp_path / "out"
    arguments = [str(CONSOLE_SCRIPT), command, *map(str, sources[command]), str(destination), "--quiet"]
    racers = [subprocess.Popen(arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [(racer.wait(timeout=120), racer.stderr.read().decode()) for racer in racers]
    for racer in racers:
        racer.stdout.close()
        racer.stderr.close()
    assert sorted(code for code, _ in results) == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    # Which error the loser gets depends on when it started: during the winner's run, or after it.
    assert_one_line_error(1, loser, str(destination))
    assert any(reason in loser for reason in ("another writer", "already exists", "already there", "not empty")), loser
    _assert_complete(destination)


def test_verify_remove_temporary_spares_a_running_writers_files(tmp_path):
    dataset = write_dataset(tmp_path / "ds", ["old"] * 3, codec="str")
    with varstore.ShardedWriter(tmp_path / "ds", codec="str", overwrite=True) as writer:
        writer.extend(["new"] * 5)
        live = sorted(path for path in os.listdir(dataset) if TEMP_MARK in path)
        assert live, "the running writer should have temporary files to spare"
        checked = run_script("verify", dataset, "--remove-temporary", "--json")
        assert checked.returncode == 0, checked.stderr
        report = strict_json(checked.stdout.decode())
        assert report["removed_temporary_files"] == [] and report["writer_running"] is True
        assert sorted(path for path in os.listdir(dataset) if TEMP_MARK in path) == live
        text = run_script("verify", dataset).stdout.decode()
        assert "note: a writer is running here" in text
    assert list(varstore.open(dataset)) == ["new"] * 5
    assert run_script("verify", dataset).returncode == 0
