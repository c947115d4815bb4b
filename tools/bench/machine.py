"""What the figures were measured on: processor, cores, memory, kernel, disk read-ahead, library versions."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

DISTRIBUTIONS = ("varstore", "numpy", "torch", "pyarrow", "datasets", "lmdb", "h5py", "mosaicml-streaming", "litdata",
                 "megatron-core")


def _first_line_with(path: str, prefix: str) -> str:
    try:
        with open(path) as stream:
            return next((line.split(":", 1)[1].strip() for line in stream if line.startswith(prefix)), "?")
    except OSError:
        return "?"


def _read_ahead_kb(path: str) -> str:
    """The block device holding `path` and its read-ahead, which decides how much a page fault pulls in."""
    device = os.stat(path).st_dev
    block = os.path.realpath(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    for queue in (os.path.join(block, "queue"), os.path.join(os.path.dirname(block), "queue")):
        try:
            with open(os.path.join(queue, "read_ahead_kb")) as stream:
                return f"{os.path.basename(os.path.dirname(queue))}: {stream.read().strip()} KiB"
        except OSError:
            continue
    return "?"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_machine(data_path: str) -> dict[str, Any]:
    """The machine, and the disk under `data_path`."""
    return {
        "cpu": _first_line_with("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "read_ahead": _read_ahead_kb(data_path),
        "versions": {name: _version(name) for name in DISTRIBUTIONS},
    }
