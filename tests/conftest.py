"""Shared test set-up: deterministic hypothesis profiles so a noisy machine never makes a test flaky."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["tests.helpers_s3"]  # the session's S3 server fixture, `s3_server`

settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_SESSION_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Point the node cache (and the remote writer's staging) at a folder of this run, never the user's
    ~/.cache: tests and the README blocks they run (which inherit the environment) share it."""
    _SESSION_CACHE.append(tempfile.mkdtemp(prefix="varstore-test-cache-"))
    os.environ["VARSTORE_CACHE_DIR"] = _SESSION_CACHE[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    for directory in _SESSION_CACHE:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def memory_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory in memory (/dev/shm), where fsync is free: for tests that commit hundreds of
    shards and whose subject is not the disk. Falls back to `tmp_path`."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    directory = tempfile.mkdtemp(prefix="varstore-test-", dir="/dev/shm")
    try:
        yield Path(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
