"""A real, small filesystem for the tests whose subject is a full disk: a tmpfs mounted by the test.

Mounting needs root (CI and the development machines run as root); elsewhere the
test is skipped with the reason. The mount is private to the test and removed after it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def mounted_tmpfs(size_bytes: int) -> Iterator[Path]:
    """A fresh tmpfs of `size_bytes` (rounded up to pages by the kernel), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="varstore-tmpfs-"))
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
        capture_output=True, text=True, timeout=30,
    )
    if result.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
        mount_point.rmdir()


def fill(directory: Path) -> None:
    """Write a file that takes every free byte of the filesystem holding `directory`."""
    with open(directory / "filler", "wb", buffering=0) as file:
        for block in (bytes(1 << 16), b"\0"):
            with contextlib.suppress(OSError):
                while file.write(block):
                    pass
