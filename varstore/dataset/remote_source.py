"""A dataset in object storage as a `ShardedReader` source.

It does for a URL what the local source does for a directory, with requests instead of system calls: the
manifest is one GET; the checks §3.1 requires at open are one LIST (every object's size, 1,000 per request)
and one concurrent GET of each listed index's 64-byte header; a shard opens as a `RemoteShard` when a record
of it is first read.

The node cache names a shard's objects by the shard's identity (`shard_identity`): the dataset's version, its
manifest entry, the store's tags of its two objects from the open's listing (ETags on S3) and the header the
open read. Every process that opens the dataset (a DataLoader worker too) makes the same listing and reads the
same headers, so they share the cached copies; a dataset rewritten under the same shard names (`varstore cp
--overwrite` keeps them) is a new version, never served the old one's files.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError, MissingFileError, StorageError, VarstoreError
from ..format import header as fmt
from ..format.codecs import Codec
from ..format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_SIZE,
    Manifest,
    ShardEntry,
    check_header_against_entry,
    decode_manifest,
)
from ..remote.filesystems import StoredObject, list_objects, read_heads, read_object
from ..remote.location import RemoteLocation
from ..shard.remote_shard import RemoteShard, ReplacedCheck, fetch_whole_after


class RemoteDatasetSource:
    """The dataset whose manifest is at `location`/manifest.json."""

    is_remote = True

    def __init__(self, location: RemoteLocation) -> None:
        self.location = location
        # The identities of the shards the last `check_listed` passed, by name, with that manifest's version.
        self._identities: tuple[int, dict[str, str]] = (0, {})

    def read_manifest(self) -> Manifest:
        """The manifest as it is now, read whole in one request."""
        fs, _ = self.location.filesystem()
        path, url = self.location.child(MANIFEST_NAME)
        try:
            raw = read_object(fs, path, url=url, max_size=MAX_MANIFEST_SIZE)
        except MissingFileError:
            raise MissingFileError(
                f"no {MANIFEST_NAME}: not a varstore dataset, or its writer did not finish", path=self.location.url
            ) from None
        if len(raw) > MAX_MANIFEST_SIZE:
            raise FormatError(f"manifest is over the limit of {MAX_MANIFEST_SIZE} bytes", path=url)
        return decode_manifest(raw, path=url)

    def check_listed(self, manifest: Manifest, codec: Codec) -> dict[int, VarstoreError]:
        """The listed shards that fail the checks §3.1 requires at open, by position: each object's size (one
        listing), then each index header against its entry (one concurrent read of every header)."""
        fs, directory = self.location.filesystem()
        listed = list_objects(fs, directory, url=self.location.url)
        sizes = {name: stored.size for name, stored in listed.items()}
        damaged: dict[int, VarstoreError] = {}
        present: list[tuple[int, ShardEntry]] = []
        for position, entry in enumerate(manifest.shards):
            problem = _size_problem(self.location, entry, sizes)
            if problem is None:
                present.append((position, entry))
            else:
                damaged[position] = problem
        index_objects = [(self.location.at(entry.name).sibling(fmt.INDEX_SUFFIX)[0], entry.index_size) for _, entry in present]
        try:
            heads = read_heads(fs, index_objects, fmt.HEADER_SIZE, url=self.location.url)
        except MissingFileError as error:  # deleted since the listing: the dataset is being replaced, or damaged
            return {**damaged, **{position: error for position, _ in present}}
        identities: dict[str, str] = {}
        for (position, entry), head in zip(present, heads):
            index_url = self.location.at(entry.name).sibling(fmt.INDEX_SUFFIX)[1]
            try:
                header = fmt.unpack_header(head, index_size=entry.index_size, path=index_url)
                check_header_against_entry(header, entry, codec, index_url)
            except FormatError as error:
                damaged[position] = error
                continue
            identities[entry.name] = shard_identity(manifest.version, entry, listed, head)
        self._identities = (manifest.version, identities)
        return damaged

    def open_shard(
        self, manifest: Manifest, entry: ShardEntry, codec: Codec, *, verify_reads: bool, replaced_check: ReplacedCheck, whole: bool
    ) -> RemoteShard:
        """The shard `entry` names, its index fetched into the node cache and checked against the entry; with
        `whole`, its data object too (verified against the entry's data CRC32C)."""
        version, identities = self._identities
        identity = identities.get(entry.name) if version == manifest.version else None
        shard = RemoteShard.open_listed(
            self.location.at(entry.name),
            sizes=(entry.data_size, entry.index_size),
            index_crc32c=entry.index_crc32c,
            verify_reads=verify_reads,
            replaced_check=lambda: self._check_replaced_if_reachable(replaced_check),
            fetch_whole_after=fetch_whole_after(entry.data_size, _cached_size(manifest), self.location.cache.limit_bytes),
            data_crc32c=entry.data_crc32c,
            identity=identity if identity is not None else shard_identity(manifest.version, entry, {}, b""),
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

    @staticmethod
    def fetch_shard(shard: Any) -> None:
        """Bring the shard's whole data object into the node cache; its reads then use the local copy."""
        shard.fetch_data()

    def fits_in_cache(self, manifest: Manifest) -> bool:
        """Whether the node cache's limit leaves room for every shard's data and index objects (always, with no
        limit)."""
        limit = self.location.cache.limit_bytes
        return limit is None or _cached_size(manifest) <= limit

    def state(self) -> dict[str, Any]:
        """The options `dataset_source` takes to reach this dataset again from its URL."""
        return self.location.options()


def shard_identity(version: int, entry: ShardEntry, listed: dict[str, StoredObject], head: bytes) -> str:
    """What names the content of shard `entry` of dataset version `version` in the node cache: the version (a
    BLAKE2b digest of the manifest's bytes), every member of the entry, the store's tags of its data and index
    objects in the listing `listed` (ETag, version id, else modification time), and its 64-byte index header
    `head`. Index files that differ only in their header share their size and CRC32C (§3.1: the CRC32C of the
    header is a constant), so the cache may not name them by those alone."""
    tags = [
        listed[entry.name + suffix].tag if entry.name + suffix in listed else ""
        for suffix in (fmt.DATA_SUFFIX, fmt.INDEX_SUFFIX)
    ]
    return (
        f"dataset {version:032x}; shard {entry.name} records {entry.records} data {entry.data_size} "
        f"{entry.data_crc32c:08x} [{tags[0]}] index {entry.index_size} {entry.index_crc32c:08x} [{tags[1]}]; "
        f"header {head.hex()}"
    )


def _cached_size(manifest: Manifest) -> int:
    """The bytes the node cache holds once every object of the dataset is in it: index files are cached too, so a
    limit of just the data's size would evict, and download again, while a shuffled epoch fetches shards whole."""
    return sum(entry.data_size + entry.index_size for entry in manifest.shards)


def _size_problem(location: RemoteLocation, entry: ShardEntry, sizes: dict[str, int]) -> VarstoreError | None:
    """Why the objects of `entry` do not match it (missing, or not the listed size), or None."""
    for suffix, expected in ((fmt.DATA_SUFFIX, entry.data_size), (fmt.INDEX_SUFFIX, entry.index_size)):
        url = location.at(entry.name).url + suffix
        found = sizes.get(entry.name + suffix)
        if found is None:
            return MissingFileError("shard object listed in the manifest is missing", path=url)
        if found != expected:
            return FormatError(f"shard object is {found} bytes, the manifest says {expected}", path=url)
    return None
