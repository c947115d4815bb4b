"""varstore without its C extension: the pure-Python paths a machine without a compiler runs pass the tests too.

With ``VARSTORE_NO_EXTENSION=1`` `varstore._native.speedups` is None and every caller takes its Python path
(checksums, the msgpack check, record reads). A child pytest runs a representative part of the suite (codecs,
reads, damage, writes, verification, the spec's vectors) that way; the full suite runs with the extension.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# About 25 s in all on a quiet machine: the codec, reader, writer, damage, verify and spec-vector tests.
PURE_PYTHON_TESTS = [
    "tests/test_codec_properties.py",
    "tests/test_codec_params.py",
    "tests/test_msgpack_encoding.py",
    "tests/test_bool_records.py",
    "tests/test_reader.py",
    "tests/test_reader_damage.py",
    "tests/test_untrusted_input.py",
    "tests/test_corruption.py",
    "tests/test_writer.py",
    "tests/test_writer_append_buffer.py",
    "tests/test_writer_reader_agreement.py",
    "tests/test_boundaries.py",
    "tests/test_verify_every_rule.py",
    "tests/test_spec_vectors.py",
]
# Safety nets against a hung child, never expectations of speed (a file takes seconds on a quiet machine): the
# child's limit lies below this test's own, so a hang reports as this test's failure with the child's output.
CHILD_TIMEOUT = 900
TEST_TIMEOUT = CHILD_TIMEOUT + 120
IMPORT_CHECK_TIMEOUT = 600


def without_extension() -> dict[str, str]:
    return {**os.environ, "VARSTORE_NO_EXTENSION": "1"}


@pytest.mark.timeout(IMPORT_CHECK_TIMEOUT + 60)
def test_no_extension_variable_leaves_varstore_without_its_extension():
    check = ("import varstore._native as native, varstore.shard.reader, varstore.format.checksum, varstore.format.msgpack_bounds; "
             "assert native.speedups is None; "
             "assert varstore.shard.reader.speedups is varstore.format.checksum.speedups is varstore.format.msgpack_bounds.speedups is None")
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=without_extension(), capture_output=True,
                            text=True, timeout=IMPORT_CHECK_TIMEOUT)
    assert result.returncode == 0, result.stderr


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("test_file", PURE_PYTHON_TESTS, ids=[Path(name).stem for name in PURE_PYTHON_TESTS])
def test_suite_passes_on_the_pure_python_paths(test_file):
    """One child pytest per file, so each has a limit of its own and a failure names its file."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", test_file],
        cwd=ROOT, env=without_extension(), capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
