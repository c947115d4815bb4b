"""Shared by the command-line tests: run ``varstore`` in process or as the installed console script, build and damage stores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import varstore
from varstore.cli import main

CONSOLE_SCRIPT = Path(sys.executable).with_name("varstore")
VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
VECTOR_NAMES = sorted(path.stem for path in VECTORS.glob("*.json"))


def run(capsys: Any, *args: Any) -> tuple[int, str, str]:
    """`main` in this process: (exit code, stdout, stderr)."""
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def strict_json(text: str) -> Any:
    """Parse `text` as strict JSON: bare NaN, Infinity and -Infinity are refused, as jq and other parsers should."""
    return json.loads(text, parse_constant=_refuse_constant)


def run_json(capsys: Any, *args: Any, expected_code: int = 0) -> Any:
    """`main` with ``--json`` added; the one strict JSON document it printed."""
    code, out, err = run(capsys, *args, "--json")
    assert code == expected_code, err
    return strict_json(out)


def run_json_lines(capsys: Any, *args: Any) -> list[Any]:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return [strict_json(line) for line in out.splitlines()]


def run_script(*args: Any) -> subprocess.CompletedProcess[bytes]:
    """The installed console script, as a shell user runs it."""
    return subprocess.run([str(CONSOLE_SCRIPT), *map(str, args)], capture_output=True, timeout=120)


def write_dataset(directory: Path, records: list[Any], **options: Any) -> Path:
    with varstore.ShardedWriter(directory, **options) as writer:
        writer.extend(records)
    return directory


def write_shard(prefix: Path, records: list[Any], **options: Any) -> Path:
    with varstore.Writer(prefix, **options) as writer:
        writer.extend(records)
    return prefix


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0x01]))


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    """A user error: non-zero exit, one line on stderr naming what went wrong, no traceback."""
    assert code != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
