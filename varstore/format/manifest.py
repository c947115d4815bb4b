"""A dataset's manifest (§3) as bytes and back: `Manifest` and its `ShardEntry` list, parsed and checked
(`decode_manifest`) or encoded and checked (`checked_manifest_bytes`), the dataset version it gives
(`manifest_digest`), and the checks of a shard's header and codec against its entry. Nothing here reads or
writes a file: `varstore.local.manifest_file` does that in a directory; at a URL the remote readers and writers
fetch and upload the bytes.

It holds the format name and version, the codec shared by every shard, user
metadata, and per shard its file name, record count, file sizes and checksums.
Shard names are plain file names inside the dataset directory; nothing in a
manifest can point outside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import FormatError, ShardExistsError
from . import header as fmt
from .checksum import crc32c
from .codecs import Codec, codec_from_stored
from .metadata import MAX_METADATA_DEPTH, canonical_json, dump_strict_json, parse_strict_json

MANIFEST_NAME = "manifest.json"


MANIFEST_FORMAT = "varstore-dataset"


MANIFEST_VERSION = 1


MAX_MANIFEST_SIZE = 64 << 20


_SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


_U32 = 1 << 32


_CRC32C = "crc32c"


_MANIFEST_MEMBERS = frozenset({"format", "version", "codec", "metadata", "shards"})  # and _CRC32C, since 1.1


_CODEC_MEMBERS = frozenset({"name", "params"})


SHARD_FILE_NOT_REGULAR = "shard files must be regular files inside the dataset directory, not links"


@dataclass(frozen=True)
class ShardEntry:
    """What the manifest records of one shard: enough to detect a missing, truncated or swapped file."""

    name: str
    records: int
    data_size: int
    index_size: int
    index_crc32c: int
    data_crc32c: int


_SHARD_MEMBERS = frozenset(entry_field.name for entry_field in dataclasses.fields(ShardEntry))


@dataclass(frozen=True)
class Manifest:
    codec: str
    codec_params: dict[str, Any]
    metadata: dict[str, Any]
    shards: list[ShardEntry] = field(default_factory=list)

    version: int = field(default=0, compare=False)
    """BLAKE2b-128 digest of the manifest's bytes as read: which version of the dataset this is (0 for one not
    read from disk). A cryptographic digest, so no crafted replacement passes for the version a reader pinned."""

    def encode(self) -> bytes:
        """The manifest file: indented JSON for people, with its ``"crc32c"`` member (`manifest_crc32c`)."""
        document = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "codec": {"name": self.codec, "params": self.codec_params},
            "metadata": self.metadata,
            "shards": [asdict(entry) for entry in self.shards],
        }
        document[_CRC32C] = manifest_crc32c(document)
        return dump_strict_json(document, what="the manifest", sort_keys=True, indent=1) + b"\n"


def manifest_crc32c(document: dict[str, Any]) -> int:
    """CRC32C of the canonical JSON (§1.4) of a manifest object without its ``"crc32c"`` member.

    Over the canonical spelling of the parsed object, not the file's bytes, so it
    protects every value (``"metadata"`` included) whatever the file's spacing.
    """
    members = {name: value for name, value in document.items() if name != _CRC32C}
    return crc32c(canonical_json(members, what="the manifest"))


def manifest_digest(raw: bytes) -> int:
    """The version of a dataset: BLAKE2b-128 of its manifest's bytes, as an integer."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=16).digest(), "little")


def is_valid_shard_name(name: Any) -> bool:
    return isinstance(name, str) and _SHARD_NAME.fullmatch(name) is not None and ".varstore-tmp-" not in name


def _require_members(value: dict[str, Any], members: frozenset[str], what: str, path: str, optional: str = "") -> None:
    """Refuse an object whose members are not exactly `members` (plus `optional`): an unknown one would be ignored."""
    unknown = sorted(value.keys() - members - {optional})
    if unknown:
        raise FormatError(f"{what} has the unknown member {unknown[0]!r}; its members are {sorted(members)}", path=path)
    missing = sorted(members - value.keys())
    if missing:
        raise FormatError(f"{what} lacks the member {missing[0]!r}", path=path)


def _require_int(value: Any, low: int, high: int, what: str, path: str) -> int:
    if type(value) is not int or not low <= value < high:
        raise FormatError(f"{what} must be an integer in [{low}, {high}), found {value!r}", path=path)
    return value


def decode_manifest(raw: bytes, *, path: str) -> Manifest:
    """Parse and validate a manifest; every field is checked before any is trusted."""
    document = parse_strict_json(raw, MAX_METADATA_DEPTH, what="manifest", path=path)
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise FormatError(f'not a varstore manifest: expected "format": "{MANIFEST_FORMAT}"', path=path)
    if type(document.get("version")) is not int or document.get("version") != MANIFEST_VERSION:
        raise FormatError(f"manifest version {document.get('version')!r} is not supported; expected {MANIFEST_VERSION}", path=path)
    if _CRC32C in document:  # absent in manifests of 1.0 writers, which are read without the check
        _check_manifest_crc32c(document, path)
    _require_members(document, _MANIFEST_MEMBERS, "the manifest", path, optional=_CRC32C)
    codec, metadata, shards = document["codec"], document["metadata"], document["shards"]
    if not isinstance(codec, dict):
        raise FormatError('manifest "codec" must be {"name": str, "params": object}', path=path)
    _require_members(codec, _CODEC_MEMBERS, 'the manifest\'s "codec"', path)
    if not isinstance(codec["name"], str) or not isinstance(codec["params"], dict):
        raise FormatError('manifest "codec" must be {"name": str, "params": object}', path=path)
    codec_from_stored(codec["name"], codec["params"], path=path)  # exact parameters (§2), refused at open
    if not isinstance(metadata, dict) or not isinstance(shards, list):
        raise FormatError('manifest needs a "metadata" object and a "shards" list', path=path)
    entries, names, total = [], {}, 0  # names: each listed name by its ASCII-lowercase form
    for position, item in enumerate(shards):
        if not isinstance(item, dict):
            raise FormatError(f"shard entry {position} is not an object", path=path)
        if item.keys() != _SHARD_MEMBERS:
            _require_members(item, _SHARD_MEMBERS, f"shard entry {position}", path)
        name = item["name"]
        if not is_valid_shard_name(name):
            raise FormatError(f"shard entry {position} has name {name!r}: names must be plain file names", path=path)
        folded = name.lower()  # names are ASCII (the regex), so lower() folds exactly ASCII case
        if folded in names:
            if names[folded] == name:
                raise FormatError(f"shard {name!r} is listed twice", path=path)
            raise FormatError(
                f"shard names {names[folded]!r} and {name!r} differ only in case: on a case-insensitive "
                "filesystem they are one pair of files",
                path=path,
            )
        names[folded] = name
        entry = ShardEntry(
            name=name,
            records=_require_int(item["records"], 0, 1 << 63, f"shard {name!r} records", path),
            data_size=_require_int(item["data_size"], 0, 1 << 63, f"shard {name!r} data_size", path),
            index_size=_require_int(item["index_size"], fmt.HEADER_SIZE, 1 << 63, f"shard {name!r} index_size", path),
            index_crc32c=_require_int(item["index_crc32c"], 0, _U32, f"shard {name!r} index_crc32c", path),
            data_crc32c=_require_int(item["data_crc32c"], 0, _U32, f"shard {name!r} data_crc32c", path),
        )
        total += entry.records
        if total >= 1 << 63:
            raise FormatError("the shards hold more than 2**63 - 1 records in total", path=path)
        entries.append(entry)
    return Manifest(codec["name"], codec["params"], metadata, entries, version=manifest_digest(raw))


def _check_manifest_crc32c(document: dict[str, Any], path: str) -> None:
    expected = _require_int(document[_CRC32C], 0, _U32, 'manifest "crc32c"', path)
    computed = manifest_crc32c(document)
    if computed != expected:
        raise FormatError(
            f"manifest checksum is {computed:#010x} over the canonical JSON of its members, expected {expected:#010x} "
            'from its "crc32c" member: the manifest is damaged',
            path=path,
        )


def damaged_manifest_refusal(error: Exception, path: str) -> ShardExistsError:
    """What a writer not asked to overwrite raises on finding a damaged manifest: a dataset is there, its
    shards unknown."""
    return ShardExistsError(
        f"a dataset already exists here (its manifest is damaged: {error}); pass overwrite=True to replace it", path=path
    )


def check_header_against_entry(header: fmt.Header, entry: ShardEntry, codec: Codec, index_path: str) -> None:
    """Refuse a shard whose header disagrees with its manifest entry: another shard, or a damaged entry or header."""
    facts = (
        ("record count", header.record_count, entry.records),
        ("data size", header.data_size, entry.data_size),
        ("data checksum", header.data_crc32c, entry.data_crc32c),
        ("index checksum", fmt.index_crc32c(header), entry.index_crc32c),
        ("codec id", header.codec_id, codec.id),
    )
    for what, found, listed in facts:
        if found != listed:
            raise FormatError(
                f"shard does not match the manifest: its {what} is {found}, the manifest says {listed}; "
                "it was replaced, is damaged, or belongs to another dataset",
                path=index_path,
            )


def check_codec_params(found: Codec, listed: Codec, index_path: str) -> None:
    """Refuse a shard whose metadata's codec parameters are not the manifest's (§3.1, before reading from it)."""
    if found.params() != listed.params():
        raise FormatError(
            f"shard does not match the manifest: its codec parameters are {found.params()}, "
            f"the manifest says {listed.params()}",
            path=index_path,
        )


def checked_manifest_bytes(manifest: Manifest, *, path: str) -> bytes:
    """`manifest` encoded, refused (`FormatError`) unless every reader would accept it back as it is.

    Writers check with the reader's own rules (`decode_manifest`) before committing,
    so a manifest with a duplicate or invalid shard name, metadata keys that JSON
    would turn into strings, or a size over `MAX_MANIFEST_SIZE` is never published.
    """
    raw = manifest.encode()  # refuses keys that are not str: JSON would turn {1: 2} into {"1": 2}
    if len(raw) > MAX_MANIFEST_SIZE:
        raise FormatError(
            f"a manifest of {len(manifest.shards)} shards is {len(raw)} bytes, over the limit of {MAX_MANIFEST_SIZE}; "
            "write fewer, larger shards",
            path=path,
        )
    decode_manifest(raw, path=path)
    return raw


def shard_entry_size_bound(name: str) -> int:
    """Bytes that listing shard `name` can add to an encoded manifest, at most (whatever its sizes and checksums)."""
    largest = ShardEntry(name, (1 << 63) - 1, (1 << 63) - 1, (1 << 63) - 1, _U32 - 1, _U32 - 1)
    empty = Manifest("", {}, {})
    # + 8 for separators and indentation, + 10 for the digits of the "crc32c" member, which vary with the content.
    return len(dataclasses.replace(empty, shards=[largest]).encode()) - len(empty.encode()) + 8 + 10
