"""Verifying a valid shard whose files are sparse, on a full filesystem, must not fault a mapped page.

A hole in a file on a full tmpfs cannot be faulted in through a map: the kernel
kills the process with SIGBUS. Verification is what a user runs on a shard they
suspect, so it reads both files with ``pread``, which returns zeros for a hole
without allocating: a valid sparse shard verifies, from the library and the CLI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import varstore
from varstore.shard.index import VERIFY_CHUNK_BYTES

from .helpers_tmpfs import fill, mounted_tmpfs

ZERO_RECORD = bytes(1 << 20)  # whole zero pages in the middle of the data file: holes in a sparse copy
CODECS = {"bytes": ZERO_RECORD, "str": "\0" * len(ZERO_RECORD)}


def _sparse_shard_on_a_full_tmpfs(source: Path, root: Path) -> Path:
    """The shard `source` copied with holes into `root`, a tmpfs then filled to its last byte."""
    for suffix in (".index", ".data"):
        subprocess.run(["cp", "--sparse=always", f"{source}{suffix}", f"{root / source.name}{suffix}"], check=True, timeout=30)
    info = os.stat(f"{root / source.name}.data")
    assert info.st_blocks * 512 < info.st_size, "the copy of the data file should have holes"
    with contextlib.suppress(OSError):  # fill's final flush at close can itself hit ENOSPC
        fill(root)
    assert os.statvfs(root).f_bavail == 0
    return root / source.name


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_verify_of_a_sparse_shard_on_a_full_tmpfs_passes_without_sigbus(tmp_path, codec):
    with varstore.Writer(tmp_path / "docs", codec=codec) as writer:  # empty records: zero offsets and checksums
        writer.extend([CODECS[codec][:0]] * 3000 + [CODECS[codec]] * 3 + [CODECS[codec][:1000]])
    with mounted_tmpfs(1 << 20) as root:
        shard = _sparse_shard_on_a_full_tmpfs(tmp_path / "docs", root)
        child = subprocess.run(
            [sys.executable, "-c", "import sys, varstore; varstore.open(sys.argv[1]).verify(); print('verified')", str(shard)],
            capture_output=True, text=True, timeout=120, check=False,
        )
    assert child.returncode == 0, f"verify died with return code {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.strip() == "verified"


def test_cli_verify_of_a_sparse_dataset_on_a_full_tmpfs_reports_ok(tmp_path):
    with varstore.ShardedWriter(tmp_path / "ds", max_shard_records=10) as writer:
        writer.extend([ZERO_RECORD] * 3 + [b"the only bytes that are not zero"])
    with mounted_tmpfs(4 << 20) as root:
        subprocess.run(["cp", "-r", "--sparse=always", str(tmp_path / "ds"), str(root / "ds")], check=True, timeout=30)
        shard = next((root / "ds").glob("*.data"))
        assert os.stat(shard).st_blocks * 512 < os.stat(shard).st_size, "the copy of the data file should have holes"
        with contextlib.suppress(OSError):
            fill(root / "ds")
        assert os.statvfs(root).f_bavail == 0
        child = subprocess.run([sys.executable, "-m", "varstore", "verify", str(root / "ds")],
                               capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 0, f"varstore verify exited {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.startswith("ok: 4 records in 1 shard"), child.stdout


def test_verify_lists_a_damaged_record_larger_than_a_read_chunk(tmp_path):
    records = [b"a" * 10, bytes(range(256)) * (3 * VERIFY_CHUNK_BYTES // 256), b"b" * 10]
    with varstore.Writer(tmp_path / "docs") as writer:
        writer.extend(records)
    with open(tmp_path / "docs.data", "r+b") as data:
        data.seek(10 + 2 * VERIFY_CHUNK_BYTES + 5)  # inside record 1, past its first chunk's worth of bytes
        data.write(b"\xff")
    with varstore.open(tmp_path / "docs") as reader, pytest.raises(varstore.CorruptRecordError) as caught:
        reader.verify()
    assert caught.value.records == [1]


def test_verify_of_a_shard_replaced_since_it_was_opened_verifies_the_readers_own_view(tmp_path):
    """An open reader keeps the files it opened (its maps) after they are replaced by rename: verify checks
    those, not the damaged replacement now at the path."""
    for name, record in (("docs", b"first"), ("other", b"second")):
        with varstore.Writer(tmp_path / name) as writer:
            writer.append(record)
    with open(tmp_path / "other.data", "r+b") as data:
        data.write(b"S")  # damaged: "Second" fails the data checksum
    with varstore.open(tmp_path / "docs") as reader:
        for suffix in (".index", ".data"):
            os.replace(tmp_path / f"other{suffix}", tmp_path / f"docs{suffix}")
        reader.verify()
        assert reader[0] == b"first"
    with pytest.raises(varstore.FormatError, match="data file does not match its index"):
        varstore.open(tmp_path / "docs")
