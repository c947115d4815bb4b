"""Argument types and options shared by the commands, and the parser of each (`command_parser`); each type raises
argparse's error, so a bad value is a usage error (exit 2)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Callable

from ..local.destination import ALLOW_OTHER_FILES_OPTION
from ..operations.locations import store_path

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


def command_parser(commands: Any, name: str, run: Callable[[argparse.Namespace], int], *, help: str,
                   description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of the command `name`, which calls `run` with the parsed arguments.

    `description` is one paragraph, however its source is wrapped; an `epilog` (examples, limits, layouts) is
    shown as written, and the description then as one line."""
    parser = commands.add_parser(
        name, help=help, description=" ".join(description.split()), epilog=epilog,
        **({"formatter_class": argparse.RawDescriptionHelpFormatter} if epilog is not None else {}),
    )
    parser.set_defaults(run=run)
    return parser


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The store path and ``--json`` that the read-only commands take."""
    parser.add_argument("path", type=store_path, help=STORE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def add_allow_other_files_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(ALLOW_OTHER_FILES_OPTION, action="store_true",
                        help="write into DST even though it holds files that are not a dataset's (they are left alone)")
