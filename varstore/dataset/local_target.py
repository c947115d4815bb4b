"""`LocalTarget`: a dataset directory on a local or mounted filesystem, as a `ShardedWriter` writes and commits it.

A writer's target is where its shards are written and what its commit points do there. Here shards are
written in the dataset directory itself, so a committed shard needs no publishing, the manifest commits by
an atomic rename (`commit_manifest_bytes`) and clean-up removes files. `RemoteTarget` does the same for a
URL, from a staging directory; `PartTarget` for one task attempt of a conversion.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import VarstoreError
from ..format import header as fmt
from ..format.codecs import Codec
from ..format.manifest import ShardEntry
from ..local.journal import manifest_identity
from ..local.locks import WriterLock, lock_directory
from ..local.manifest_file import commit_manifest_bytes
from ..local.publish import remove_quietly
from .run_start import StartedRun, begin_run


class LocalTarget:
    """The dataset directory `directory`; `path` names it in errors, `directory` is where shards are written."""

    def __init__(self, directory: Any, storage_options: dict[str, Any] | None = None) -> None:
        self.path = os.path.abspath(os.fspath(directory))  # a later chdir must not move the dataset
        if storage_options is not None:
            raise VarstoreError("storage_options apply to URLs only, and this is a local path", path=self.path)
        self.directory = self.path

    def lock(self) -> WriterLock:
        """The directory's writer lock, held from the writer's start to its end."""
        return lock_directory(self.directory)

    def start_run(self, codec: Codec, *, overwrite: bool, resume: bool) -> StartedRun:
        """Begin the run (new, overwriting or resumed) in the locked directory, as `begin_run` does."""
        return begin_run(self.directory, codec, overwrite=overwrite, resume=resume)

    def publish_shard(self, entry: ShardEntry) -> None:
        """Nothing: a shard committed in the directory is where readers look for it."""

    def publish_manifest(self, raw: bytes, *, overwrite: bool) -> None:
        """Commit the checked manifest bytes `raw`: the moment readers see the dataset."""
        commit_manifest_bytes(self.directory, raw, overwrite=overwrite)

    def manifest_committed(self, version: int) -> bool:
        """Whether the manifest stored now is the one whose CRC32C is `version`."""
        return manifest_identity(self.directory) == version

    def remove_shards(self, names: list[str]) -> None:
        """Remove the files of shards `names` (a replaced version's): whatever cannot be removed stays, unlisted."""
        for name in names:
            remove_quietly(list(fmt.shard_paths(os.path.join(self.directory, name))))

    def end_run(self) -> None:
        """Nothing more than the writer's own journal, which it removes itself."""

    def abandon(self, names: list[str]) -> None:
        """Nothing: the writer removes the files of the shards `names` it wrote here itself."""
