"""A dataset in object storage as a `ShardedReader` source.

It does for a URL what the local source does for a directory, with requests instead of system calls, and
opens in O(1) requests whatever the shard count: the manifest is one GET (none in a process whose node cache
holds the version it was asked to open: a DataLoader worker reopening a pickled reader), and each shard's
objects are checked against its manifest entry when a record of it is first read (spec §4.1), not at the open:
its index is fetched whole and checked (§1.3), and its data object's size and edges are read.

The node cache names a shard's objects by the shard's identity (`shard_identity`): the dataset's version (a
digest of the manifest's bytes) and the shard's manifest entry. A dataset rewritten under the same shard names
(`varstore cp --overwrite` keeps them) is a new version, never served the old one's files; what arrives is
checked against the entry before it is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import FormatError, MissingFileError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.checksum import crc32c
from ..format.codecs import Codec
from ..format.manifest import MANIFEST_NAME, MAX_MANIFEST_SIZE, Manifest, ShardEntry, decode_manifest
from ..remote.location import RemoteLocation
from ..remote.read_plan import ObjectRanges
from ..shard.remote_shard import RemoteShard, ReplacedCheck, fetch_whole_after


class RemoteDatasetSource:
    """The dataset whose manifest is at `location`/manifest.json."""

    is_remote = True

    def __init__(self, location: RemoteLocation) -> None:
        self.location = location
        self.stamp: ManifestStamp | None = None
        self._dataset_bytes = (0, 0)  # (version, `_cached_size`) of the manifest last asked about

    def read_manifest(self) -> Manifest:
        """The manifest as it is now, read whole in one request."""
        return self._fetch_manifest()[0]

    def open_manifest(self, stamp: ManifestStamp | None) -> Manifest:
        """The manifest a reader opens: the version `stamp` names from the node cache, if it holds it (no request),
        else the one stored now (one GET), kept in the node cache for the processes that reopen this reader."""
        if stamp is not None:
            manifest = self._cached_manifest(stamp)
            if manifest is not None:
                self.stamp = stamp
                return manifest
        manifest, raw = self._fetch_manifest()
        self.stamp = ManifestStamp(manifest.version, len(raw), crc32c(raw))
        self._keep_manifest(raw, self.stamp)
        return manifest

    def _keep_manifest(self, raw: bytes, stamp: ManifestStamp) -> None:
        """Keep the manifest's bytes `raw` in the node cache for the processes that reopen this reader. If the cache
        cannot take them (a full disk), the open still succeeds: a reopening process then GETs the manifest, and
        a read that needs the cache fails on its own, naming the object it could not keep."""
        _, url = self.location.child(MANIFEST_NAME)
        try:
            fd = self.location.cache.open(url, len(raw), stamp.crc32c, lambda path: _write_file(path, raw), identity=stamp.identity)
        except StorageError:
            return
        os.close(fd)

    def _fetch_manifest(self) -> tuple[Manifest, bytes]:
        _, url = self.location.child(MANIFEST_NAME)
        try:
            raw = self.location.transport().read_object(url, max_size=MAX_MANIFEST_SIZE)
        except MissingFileError:
            raise MissingFileError(
                f"no {MANIFEST_NAME}: not a varstore dataset, or its writer did not finish", path=self.location.url
            ) from None
        if len(raw) > MAX_MANIFEST_SIZE:
            raise FormatError(f"manifest is over the limit of {MAX_MANIFEST_SIZE} bytes", path=url)
        return decode_manifest(raw, path=url), raw

    def _cached_manifest(self, stamp: ManifestStamp) -> Manifest | None:
        """The manifest `stamp` names, if the node cache holds it and its bytes are that version; else None."""
        _, url = self.location.child(MANIFEST_NAME)
        local = self.location.cache.cached(url, stamp.size, stamp.crc32c, identity=stamp.identity)
        if local is None:
            return None
        try:
            with open(local, "rb") as file:
                raw = file.read(stamp.size + 1)
            manifest = decode_manifest(raw, path=url)
        except (OSError, VarstoreError):  # evicted meanwhile, or not what it should be: fetch it
            return None
        return manifest if manifest.version == stamp.version else None

    def check_listed(self, manifest: Manifest, codec: Codec) -> dict[int, VarstoreError]:
        """Nothing, and no request: in object storage each shard is checked against its entry at its first use
        (§4.1), so that an open costs the same for 10 shards and for 100,000."""
        return {}

    def open_shard(
        self, manifest: Manifest, entry: ShardEntry, codec: Codec, *, verify_reads: bool, replaced_check: ReplacedCheck, whole: bool
    ) -> RemoteShard:
        """The shard `entry` names, its index fetched into the node cache and checked against the entry; with
        `whole`, its data object too (verified against the entry's data CRC32C)."""
        shard = RemoteShard.open_listed(
            self.location.at(entry.name),
            sizes=(entry.data_size, entry.index_size),
            index_crc32c=entry.index_crc32c,
            verify_reads=verify_reads,
            replaced_check=lambda: self._check_replaced_if_reachable(replaced_check),
            fetch_whole_after=fetch_whole_after(entry.data_size, self._cached_size(manifest), self.location.cache.limit_bytes),
            data_crc32c=entry.data_crc32c,
            identity=shard_identity(manifest.version, entry),
            whole=whole,
        )
        shard.check_against_entry(entry, codec)
        return shard

    def _check_replaced_if_reachable(self, replaced_check: ReplacedCheck) -> None:
        """`replaced_check()`, unless the manifest cannot be fetched at all (an outage, persistent 503s): storage
        that does not answer says nothing about a replacement, so the failed read's own `StorageError` stands."""
        try:
            self.read_manifest()
        except StorageError:
            return
        except VarstoreError:
            pass  # deleted or damaged: the reader's own check says the dataset was replaced
        replaced_check()

    def read_batch(self, objects: Sequence[ObjectRanges], replaced_check: ReplacedCheck) -> list[list[bytes]]:
        """The ranges of every data object of `objects` (a batch's, over its shards), planned and fetched at once
        (`Transport.read_batch`); a failure raises `DatasetReplacedError` instead if the dataset was replaced."""
        if not objects:
            return []
        try:
            return self.location.transport().read_batch(objects)
        except (MissingFileError, StorageError, FormatError):  # a replacing dataset's objects fail ranges as well
            self._check_replaced_if_reachable(replaced_check)
            raise

    @staticmethod
    def fetch_shard(shard: Any) -> None:
        """Bring the shard's whole data object into the node cache; its reads then use the local copy."""
        shard.fetch_data()

    def fits_in_cache(self, manifest: Manifest) -> bool:
        """Whether the node cache's limit leaves room for every shard's data and index objects (always, with no
        limit)."""
        limit = self.location.cache.limit_bytes
        return limit is None or self._cached_size(manifest) <= limit

    def _cached_size(self, manifest: Manifest) -> int:
        """`_cached_size` of `manifest`, computed once per version (a shard's open asks it)."""
        version, size = self._dataset_bytes
        if version != manifest.version:
            size = _cached_size(manifest, self.stamp.size if self.stamp is not None else 0)
            self._dataset_bytes = (manifest.version, size)
        return size

    def state(self) -> dict[str, Any]:
        """The options `dataset_source` takes to reach this dataset again from its URL."""
        return self.location.options()


def shard_identity(version: int, entry: ShardEntry) -> str:
    """What names the content of shard `entry` of dataset version `version` in the node cache: the version (a
    BLAKE2b digest of the manifest's bytes) and every member of the entry. Not the entry's sizes and CRC32Cs
    alone: index files that differ only in their header share them (§3.1: the CRC32C of a header is a constant),
    and the version tells two datasets apart that list the same names."""
    return (
        f"dataset {version:032x}; shard {entry.name} records {entry.records} data {entry.data_size} "
        f"{entry.data_crc32c:08x} index {entry.index_size} {entry.index_crc32c:08x}"
    )


@dataclass(frozen=True)
class ManifestStamp:
    """What finds the bytes of one manifest version in the node cache: the version, the bytes' size and CRC32C.
    A reader pickles it, so that a process reopening the reader reads that version without a request."""

    version: int
    size: int
    crc32c: int

    @property
    def identity(self) -> str:
        return f"manifest {self.version:032x}"


def _write_file(path: str, raw: bytes) -> None:
    with open(path, "wb") as file:
        file.write(raw)


def _cached_size(manifest: Manifest, manifest_size: int) -> int:
    """The bytes the node cache holds once every object of the dataset is in it: the data objects, and also the
    manifest, every index file and the edges of every data object larger than both edges (`RemoteShard`), so a
    limit of just the data's size would evict, and download again, while an epoch fetches shards whole."""
    edges = sum(2 * fmt.EDGE_SIZE for entry in manifest.shards if entry.data_size > 2 * fmt.EDGE_SIZE)
    return manifest_size + edges + sum(entry.data_size + entry.index_size for entry in manifest.shards)
