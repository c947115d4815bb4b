"""Opening a valid shard whose data file is sparse, on a full filesystem, must not fault a mapped page.

A hole in a file on a full tmpfs cannot be faulted in through a map: the kernel
kills the process with SIGBUS. Opening therefore reads with ``pread``, which
returns zeros for a hole without allocating. (Reading a record that lies in a hole
still goes through the map and may still SIGBUS; that is the documented limit, so
no test reads one.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import varstore

from .helpers_tmpfs import fill, mounted_tmpfs

ZERO_RUN = bytes(64 << 10)  # whole zero pages at both ends of the data file, where open checks its edges


def test_open_of_a_sparse_shard_on_a_full_tmpfs_does_not_die_of_sigbus(tmp_path):
    with varstore.Writer(tmp_path / "docs") as writer:  # empty records: zero offsets and checksums, holes in the index
        writer.extend([b""] * 3000 + [ZERO_RUN, b"the only bytes that are not zero", ZERO_RUN])
    with mounted_tmpfs(1 << 20) as root:
        for suffix in (".index", ".data"):
            subprocess.run(["cp", "--sparse=always", str(tmp_path / f"docs{suffix}"), str(root / f"docs{suffix}")],
                           check=True, timeout=30)
            info = os.stat(root / f"docs{suffix}")
            assert info.st_blocks * 512 < info.st_size, f"the copy of docs{suffix} should have holes"
        with contextlib.suppress(OSError):  # fill's final flush at close can itself hit ENOSPC
            fill(root)
        assert os.statvfs(root).f_bavail == 0
        child = subprocess.run(
            [sys.executable, "-c", "import sys, varstore; print(len(varstore.open(sys.argv[1])))", str(root / "docs")],
            capture_output=True, text=True, timeout=60,
        )
    assert child.returncode == 0, f"open died with return code {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.strip() == "3003"
