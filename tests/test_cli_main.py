"""The command line as a whole: console script and ``python -m`` wiring, help, exit codes, one-line errors."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys

import pytest

import varstore
from varstore.format.header import HEADER_SIZE

from .helpers_cli import CONSOLE_SCRIPT, assert_one_line_error, flip_byte, run, run_script, write_dataset, write_shard

COMMANDS = ("info", "dump", "verify", "stats", "convert", "merge", "repair")


def test_console_script_and_python_module_run_the_same_command_line(tmp_path):
    shard = write_shard(tmp_path / "docs", [b"a", b"bc"])
    script = run_script("info", shard, "--json")
    module = subprocess.run([sys.executable, "-m", "varstore", "info", str(shard), "--json"], capture_output=True, timeout=120)
    assert script.returncode == module.returncode == 0, (script.stderr, module.stderr)
    assert script.stdout == module.stdout
    assert b'"record_count": 2' in script.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_that_exits_0(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: varstore {command}")


def test_top_level_help_lists_every_command(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert all(command in out for command in COMMANDS)


@pytest.mark.parametrize(
    "arguments",
    [[], ["frobnicate"], ["info"], ["dump", "x", "--head", "two"], ["dump", "x", "--head", "1", "--tail", "1"],
     ["merge", "only-one"], ["convert", "a.npy", "b", "--max-shard-bytes", "lots"], ["stats", "x", "--bins", "0"]],
)
def test_usage_errors_exit_2_in_one_line(capsys, arguments):
    code, _, err = run(capsys, *arguments)
    assert code == 2
    assert_one_line_error(code, err, "varstore", "--help")
    assert "usage:" not in err


@pytest.mark.parametrize("command", ["info", "dump", "verify", "stats"])
def test_missing_path_is_one_clear_line(capsys, tmp_path, command):
    code, out, err = run(capsys, command, tmp_path / "absent")
    assert_one_line_error(code, err, f"varstore {command}:", "absent", "no varstore shard or dataset")
    assert code == 1 and out == ""


@pytest.mark.parametrize("command", ["info", "dump", "stats", "merge"])
def test_file_of_another_kind_is_one_clear_line(capsys, tmp_path, command):
    (tmp_path / "notes.index").write_bytes(b"these are notes, not a varstore index" * 4)
    (tmp_path / "notes.data").write_bytes(b"")
    arguments = [tmp_path / "notes.index"] + ([tmp_path / "out"] if command == "merge" else [])
    code, _, err = run(capsys, command, *arguments)
    assert_one_line_error(code, err, "notes.index", "not a varstore index")


def test_damaged_header_is_one_line_from_the_console_script(tmp_path):
    shard = write_shard(tmp_path / "docs", [b"x" * 100])
    flip_byte(tmp_path / "docs.index", HEADER_SIZE // 2)
    result = run_script("dump", shard)
    assert result.returncode == 1
    assert_one_line_error(result.returncode, result.stderr.decode(), "docs.index", "header checksum")


def test_missing_shard_is_one_line_from_the_console_script(tmp_path):
    dataset = write_dataset(tmp_path / "ds", [b"a", b"b"], max_shard_records=1)
    (dataset / "shard-000001.data").unlink()
    result = run_script("stats", dataset)
    assert_one_line_error(result.returncode, result.stderr.decode(), "shard-000001.data", "missing")


def test_closed_pipe_stops_dump_quietly(tmp_path):
    shard = write_shard(tmp_path / "lines", [f"line {index}" for index in range(20000)], codec="str")
    with subprocess.Popen([str(CONSOLE_SCRIPT), "dump", str(shard)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout.readline() == b"record 0: 6 bytes, 6 characters\n"
        process.stdout.close()
        stderr = process.stderr.read()
        assert process.wait(timeout=120) == 141
    assert stderr == b""


def test_progress_bar_on_a_terminal_without_tqdm_names_the_extra(capsys, tmp_path, monkeypatch):
    shard = write_shard(tmp_path / "docs", [b"a"])
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = run(capsys, "verify", shard)
    assert code == 0 and out.startswith("ok: 1 record in 1 shard; ")
    assert err == "varstore: progress bars need tqdm: pip install 'varstore[cli]'\n"
    code, out, err = run(capsys, "verify", shard, "--quiet")
    assert code == 0 and err == ""


def test_version_prints_the_installed_version_and_exits_0(capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == ""
    assert out == f"varstore {varstore.__version__}\n"
    assert varstore.__version__ == importlib.metadata.version("varstore")
    script = run_script("--version")
    assert script.returncode == 0 and script.stdout.decode() == out


@pytest.mark.parametrize("command", COMMANDS)
def test_keyboard_interrupt_inside_a_command_exits_130_in_one_line(capsys, tmp_path, monkeypatch, command):
    shard = write_shard(tmp_path / "docs", [b"a"])

    def interrupted(*args, **options):
        raise KeyboardInterrupt

    monkeypatch.setattr("varstore.dataset.opening._open", interrupted)  # what open and open_setting_aside_damaged call
    monkeypatch.setattr("varstore.conversion.driver.ShardedWriter", interrupted)
    monkeypatch.setattr("varstore.operations.repair.read_manifest", interrupted)
    (tmp_path / "lines.txt").write_text("a\n")
    arguments = {"convert": [tmp_path / "lines.txt", tmp_path / "out"], "merge": [shard, tmp_path / "out"],
                 "repair": [tmp_path]}.get(command, [shard])
    code, out, err = run(capsys, command, *arguments)
    assert code == 130 and out == ""
    assert err == f"varstore {command}: interrupted\n"
    assert not (tmp_path / "out").exists()


def _default_sigint() -> None:
    """In the child before exec: SIGINT's default disposition, whatever this process inherited (a suite started in
    the background, `nohup ... &`, ignores SIGINT, and an exec'd program keeps ignoring a signal it inherits so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_convert_exits_130_and_leaves_nothing(tmp_path):
    """A real SIGINT while convert waits for input: the signal lands inside the command, at a known point."""
    fifo = tmp_path / "lines.txt"
    os.mkfifo(fifo)
    with subprocess.Popen([str(CONSOLE_SCRIPT), "convert", str(fifo), str(tmp_path / "out")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint) as process:
        try:
            with open(fifo, "w") as feed:  # returns once convert has opened its source, inside the command
                feed.write("first line\n")
                feed.flush()
                process.send_signal(signal.SIGINT)
                code = process.wait(timeout=60)
        finally:
            process.kill()
        stderr = process.stderr.read().decode()
    assert code == 130, stderr
    assert stderr == "varstore convert: interrupted\n"
    assert not (tmp_path / "out").exists(), sorted(os.listdir(tmp_path / "out"))
