"""Where the commands find a store: a local path or a URL of object storage, and the options that reach a URL.

Every command that reads or writes a store takes its location through here, so the same three options mean the
same everywhere: ``--storage-options JSON`` (the filesystem's keyword arguments, as fsspec passes them: for S3,
s3fs's ``endpoint_url``, ``key``, ``secret``...), ``--cache-dir`` and ``--cache-limit`` (the node cache that
remote readers fill). Without ``--storage-options`` the backend reads its standard environment (for S3:
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``...).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..dataset.opening import open_setting_aside_damaged
from ..errors import UsageError
from ..operations.locations import Store, is_url, remote_options
from ..operations.locations import open_store as open_location
from .arguments import byte_size, json_object

STORAGE_OPTIONS_OPTION = "--storage-options"
CACHE_OPTIONS = ("--cache-dir", "--cache-limit")
REMOTE_EPILOG = """object storage:
  A STORE may be a URL: s3://bucket/dataset, gs://..., az://..., any fsspec URL
  (file:///data/ds is the local path /data/ds, written with the local locks).
  Credentials and endpoints come from the backend's standard environment (for S3:
  AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...)
  or from --storage-options, e.g.
    --storage-options '{"endpoint_url": "http://127.0.0.1:9000", "key": "...", "secret": "..."}'
  Index files (and, for verify, data files) are fetched whole into the node cache
  (--cache-dir, default $VARSTORE_CACHE_DIR, else $XDG_CACHE_HOME/varstore, else
  ~/.cache/varstore), once per machine; records are read by ranged requests."""


def add_location_options(parser: argparse.ArgumentParser, *, cache: bool = True) -> None:
    """``--storage-options`` and, for commands that read through the node cache, ``--cache-dir`` and ``--cache-limit``."""
    parser.add_argument(STORAGE_OPTIONS_OPTION, type=json_object, metavar="JSON",
                        help="URLs: the filesystem's options as a JSON object (for S3, s3fs's endpoint_url, key, "
                        "secret, ...); default: the backend's standard environment (AWS_ENDPOINT_URL, ...)")
    if cache:
        parser.add_argument("--cache-dir", metavar="DIR",
                            help="URLs: the node cache directory (default $VARSTORE_CACHE_DIR, else "
                            "$XDG_CACHE_HOME/varstore, else ~/.cache/varstore)")
        parser.add_argument("--cache-limit", type=byte_size, metavar="SIZE",
                            help="URLs: keep the node cache under SIZE (e.g. 10G), evicting least recently used objects")


def _given_options(args: argparse.Namespace) -> list[str]:
    """The location options given on the command line, by their flags."""
    names = [(STORAGE_OPTIONS_OPTION, "storage_options"), *((flag, flag[2:].replace("-", "_")) for flag in CACHE_OPTIONS)]
    return [flag for flag, name in names if getattr(args, name, None) is not None]


def check_location_options(args: argparse.Namespace, *locations: str) -> None:
    """Refuse location options when no location is a URL: they would be silently ignored."""
    given = _given_options(args)
    if given and not any(is_url(location) for location in locations):
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{' and '.join(given)} {verb} to URLs of object storage; {locations[0]} is a local path")


def location_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options that reach a URL (`varstore.operations.locations.remote_options`), from the command's options."""
    return remote_options(getattr(args, "storage_options", None), getattr(args, "cache_dir", None),
                          getattr(args, "cache_limit", None))


def open_store(location: str, args: argparse.Namespace, *, set_aside_damaged: bool = False) -> Store:
    """The reader of what `location` names (a shard or a dataset, local or at a URL), given the command's
    location options for a URL; options given for a local path are a usage error. With `set_aside_damaged` a
    dataset whose shards fail the open's checks opens with them set aside (`open_setting_aside_damaged`)."""
    check_location_options(args, location)
    if set_aside_damaged:
        return open_setting_aside_damaged(location, **location_options(args))
    return open_location(location, **location_options(args))
