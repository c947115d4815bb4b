"""A ``file://`` URL names a local path, and varstore takes it as that path wherever a path or URL is accepted, so
that it gets the local code's locks, atomic publishing and fsync: through fsspec's local filesystem a create-only
upload is not create-only and a file is written in place, so a manifest "uploaded" there could be torn or clobbered.
"""

from __future__ import annotations

import os

__all__ = ["resolve_file_url"]

# fsspec's two names for its local filesystem.
_LOCAL_SCHEMES = frozenset({"file", "local"})


def resolve_file_url(location: str | os.PathLike[str]) -> str:
    """`location` as a string, a ``file://`` (or fsspec's ``local://``) URL replaced by the path it names, read as
    fsspec reads it: what follows ``://``, so ``file:///data/ds`` is ``/data/ds`` and ``file://ds`` is ``ds``,
    relative to the current directory. Any other path or URL is returned unchanged."""
    location = os.fspath(location)
    scheme, separator, rest = location.partition("://")
    if separator and scheme.lower() in _LOCAL_SCHEMES:
        return rest
    return location
