"""Every command against damaged, forged and odd inputs: a one-line error (exit 1 or 2) or a correct answer, never a traceback.

`main` lets only the errors it knows escape as one line; anything else propagates
out of it here and fails the test, so these properties catch any exception a
hostile input can raise anywhere below the command line.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from varstore.cli import main
from varstore.format.manifest import MANIFEST_NAME

from .helpers_cli import assert_one_line_error, strict_json, write_dataset, write_shard

STORES = {
    "bytes": ([b"", b"hello", bytes(range(256)) * 3], {}),
    "str": (["", "naïve", "日本語" * 50], {"codec": "str"}),
    "ndarray": ([np.arange(12, dtype=np.float32).reshape(4, 3), np.zeros((0, 3), np.float32)],
                {"codec": "ndarray", "dtype": "float32", "shape": [3]}),
    "msgpack": ([{"a": 1, "b": [1.5, None], "c": np.arange(5, dtype=np.int16)}, {}, [b"x" * 300]], {"codec": "msgpack"}),
}
READING_COMMANDS = [["info"], ["info", "--json"], ["dump"], ["dump", "--json"], ["dump", "--raw"], ["stats"],
                    ["stats", "--json", "--bins", "4"], ["verify"], ["verify", "--json"]]
_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _run_without_traceback(capsysbinary, arguments) -> None:
    """Run one command; it must end in an exit code, with a one-line error when it fails and strict JSON when asked."""
    code = main([str(argument) for argument in arguments])
    captured = capsysbinary.readouterr()
    err = captured.err.decode("utf-8")
    assert code in (0, 1, 2), (arguments, code, err)
    if code == 0 or (arguments[0] == "verify" and code == 1 and not err):
        assert err == "" or arguments[0] == "merge", err
        if "--json" in arguments:
            for line in captured.out.decode("utf-8").splitlines():
                strict_json(line)
    else:
        assert_one_line_error(code, err, f"varstore {arguments[0]}: ")


def _damage(path, data, positions_and_values) -> None:
    for position, value in positions_and_values:
        if data:
            data[position % len(data)] = value
    path.write_bytes(bytes(data))


_CHANGES = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)


@pytest.mark.parametrize("codec", sorted(STORES))
@_SETTINGS
@given(changes=_CHANGES, cut=st.none() | st.integers(0, 1 << 12), which=st.sampled_from([".index", ".data"]))
def test_damaged_shard_is_read_or_refused_by_every_command_in_one_line(capsysbinary, tmp_path_factory, codec, changes, cut, which):
    records, options = STORES[codec]
    directory = tmp_path_factory.mktemp("shard")
    prefix = write_shard(directory / "docs", records, **options)
    target = directory / f"docs{which}"
    data = bytearray(target.read_bytes())
    _damage(target, data if cut is None else data[:cut], changes)
    for arguments in READING_COMMANDS:
        _run_without_traceback(capsysbinary, [arguments[0], prefix, *arguments[1:]])
    _run_without_traceback(capsysbinary, ["merge", prefix, directory / "merged", "--quiet"])


@_SETTINGS
@given(changes=_CHANGES, cut=st.none() | st.integers(0, 1 << 10))
def test_damaged_manifest_is_read_or_refused_by_every_command_in_one_line(capsysbinary, tmp_path_factory, changes, cut):
    directory = tmp_path_factory.mktemp("dataset")
    dataset = write_dataset(directory / "ds", [f"record {index}" for index in range(9)], codec="str", max_shard_records=4)
    data = bytearray((dataset / MANIFEST_NAME).read_bytes())
    _damage(dataset / MANIFEST_NAME, data if cut is None else data[:cut], changes)
    for arguments in READING_COMMANDS:
        _run_without_traceback(capsysbinary, [arguments[0], dataset, *arguments[1:]])
    _run_without_traceback(capsysbinary, ["merge", dataset, directory / "merged", "--quiet"])


def _odd_inputs(root):
    """Paths that are not stores in ways a user can stumble on: each gets one line from every command."""
    (root / "empty.index").write_bytes(b"")
    (root / "empty.data").write_bytes(b"")
    (root / "folder.index").mkdir()
    (root / "folder.data").write_bytes(b"")
    os.mkfifo(root / "pipe.index")
    (root / "pipe.data").write_bytes(b"")
    os.symlink(root / "loop.index", root / "loop.index")
    (root / "no-manifest").mkdir()
    (root / "manifest-folder").mkdir()
    (root / "manifest-folder" / MANIFEST_NAME).mkdir()
    (root / "manifest-array").mkdir()
    (root / "manifest-array" / MANIFEST_NAME).write_text("[1, 2]")
    (root / "manifest-deep").mkdir()
    (root / "manifest-deep" / MANIFEST_NAME).write_text("[" * 100_000 + "]" * 100_000)
    (root / "manifest-binary").mkdir()
    (root / "manifest-binary" / MANIFEST_NAME).write_bytes(b"\xff\xfe{}")
    return ["empty", "folder", "pipe", "loop.index", "no-manifest", "manifest-folder", "manifest-array", "manifest-deep",
            "manifest-binary"]


@pytest.mark.parametrize("arguments", READING_COMMANDS + [["merge", "--quiet"]])
def test_odd_paths_are_one_line_errors_for_every_command(capsysbinary, tmp_path, arguments):
    for name in _odd_inputs(tmp_path):
        extra = [tmp_path / f"merged-{name}"] if arguments[0] == "merge" else []
        code = main([arguments[0], str(tmp_path / name), *map(str, extra), *arguments[1:]])
        err = capsysbinary.readouterr().err.decode()
        assert code == 1, (name, err)
        assert_one_line_error(code, err, f"varstore {arguments[0]}: ")
