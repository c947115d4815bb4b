"""Argument types shared by the commands; each raises argparse's error, so a bad value is a usage error (exit 2)."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from ..manifest import MANIFEST_NAME

LOCAL_STORE_HELP = "a shard (its name, .index or .data file), or a dataset (its directory or its manifest.json)"
STORE_HELP = LOCAL_STORE_HELP + ", at a local path or at a URL of object storage (s3://bucket/dataset, any fsspec URL)"
_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(i?B)?", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1, got 0")
    return value


def byte_size(text: str) -> int:
    """``4096``, ``64K``, ``256M``, ``1GiB``: binary multiples."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive size such as 4096, 64K, 256M or 1G, got {text!r}")
    return int(match.group(1)) << _SIZE_POWERS[match.group(2).upper()]


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def store_path(path: str) -> str:
    """The path to open for what a user named: a dataset's ``manifest.json`` stands for its directory."""
    if os.path.basename(path) == MANIFEST_NAME and os.path.isfile(path):
        return os.path.dirname(path) or "."
    return path


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The store path and ``--json`` that the read-only commands take."""
    parser.add_argument("path", type=store_path, help=STORE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
