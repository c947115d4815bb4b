"""What is on disk, as `spec/FORMAT.md` says it: one module per part of the spec. Nothing here opens a file.

`header` (§1.2 and the file names of §1.5), `metadata` (§1.4: metadata and canonical JSON), `codecs` (§2),
`msgpack_bounds` (§2.2's bounds), `manifest` (§3), `checksum` (CRC32C), `notation` (§6.1, records as JSON).
"""
