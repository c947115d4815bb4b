"""Coverage-guided fuzzing of everything that reads untrusted bytes: shard open and reads, msgpack
records, dataset manifests. Any exception other than a VarstoreError, a disagreement between read
methods, or a crash of the process is a finding: atheris stops and writes the input as crash-*.

atheris lives outside the project's environment. Once:

    python3 -m venv /tmp/atheris-venv
    /tmp/atheris-venv/bin/pip install atheris numpy msgpack crc32c pytest hypothesis

Then, from the repository root, for a bounded time (libFuzzer options pass through):

    PYTHONPATH=. /tmp/atheris-venv/bin/python tools/fuzz_atheris.py -max_total_time=600 -rss_limit_mb=2048

libFuzzer's -rss_limit_mb also catches a read that allocates without bound. Replay a finding with
``... tools/fuzz_atheris.py crash-FILE``; turn it into a regression test in tests/.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["varstore"]):
    import varstore
    from varstore.format import header as fmt

from tests.helpers_reliability import (
    assert_reads_agree,
    exercise_store,
    header_field,
    reseal_body,
    rewrite_header,
    sealed_manifest,
    with_metadata,
    write_shard_files,
)
from tests.test_fuzz import BASE_NAMES, base_dataset, base_shards

WORKSPACE = Path(tempfile.mkdtemp(prefix="varstore-atheris-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
HEADER_FIELDS = ("record_count", "data_size", "metadata_size", "flags", "codec", "minor")
FIELD_BITS = {"flags": 16, "codec": 8, "minor": 16}


def mutated_shard(provider: atheris.FuzzedDataProvider) -> tuple[bytes, bytes]:
    index, data, _ = base_shards()[BASE_NAMES[provider.ConsumeIntInRange(0, len(BASE_NAMES) - 1)]]
    for _ in range(provider.ConsumeIntInRange(1, 4)):
        action = provider.ConsumeIntInRange(0, 6)
        if action < 4 and len(index) < fmt.HEADER_SIZE:
            continue  # nothing to recompute a CRC in
        if action == 0:  # a header field, header CRC recomputed
            field = HEADER_FIELDS[provider.ConsumeIntInRange(0, len(HEADER_FIELDS) - 1)]
            index = rewrite_header(index, **{field: provider.ConsumeIntInRange(0, 2 ** FIELD_BITS.get(field, 64) - 1)})
        elif action == 1:  # an offset, body CRC recomputed
            start = fmt.align8(fmt.HEADER_SIZE + header_field(index, "metadata_size"))
            position = start + 8 * provider.ConsumeIntInRange(0, max(0, (len(index) - start) // 8 - 1))
            index = reseal_body(index[:position] + struct.pack("<Q", provider.ConsumeIntInRange(0, 2**64 - 1)) + index[position + 8 :])
        elif action == 2:  # fuzzer bytes spliced into the index body, body CRC recomputed
            position = provider.ConsumeIntInRange(fmt.HEADER_SIZE, max(fmt.HEADER_SIZE, len(index)))
            splice = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 64))
            index = reseal_body(index[:position] + splice + index[position + len(splice) :])
        elif action == 3:  # fuzzer metadata
            index = with_metadata(index, provider.ConsumeBytes(provider.ConsumeIntInRange(0, 512)))
        elif action == 4:  # data bytes
            position = provider.ConsumeIntInRange(0, len(data))
            splice = provider.ConsumeBytes(provider.ConsumeIntInRange(0, 64))
            data = data[:position] + splice + data[position + len(splice) :]
        elif action == 5:  # truncate either file
            if provider.ConsumeBool():
                index = index[: provider.ConsumeIntInRange(0, len(index))]
            else:
                data = data[: provider.ConsumeIntInRange(0, len(data))]
        else:  # raw bit flip, no CRC fixed
            if index:
                position = provider.ConsumeIntInRange(0, len(index) - 1)
                index = index[:position] + bytes([index[position] ^ (1 << provider.ConsumeIntInRange(0, 7))]) + index[position + 1 :]
    return index, data


def msgpack_records_shard(provider: atheris.FuzzedDataProvider) -> tuple[bytes, bytes]:
    """A msgpack shard whose records are raw fuzzer bytes: the decoder and its bounds check see anything."""
    payloads = [provider.ConsumeBytes(provider.ConsumeIntInRange(0, 256)) for _ in range(provider.ConsumeIntInRange(1, 4))]
    prefix = WORKSPACE / "payloads"
    with varstore.Writer(prefix, overwrite=True) as writer:
        writer.extend(payloads)
    index = (WORKSPACE / "payloads.index").read_bytes()
    return rewrite_header(index, codec=3), (WORKSPACE / "payloads.data").read_bytes()


def mutated_manifest(provider: atheris.FuzzedDataProvider) -> bytes:
    document = json.loads(base_dataset()[1])
    if provider.ConsumeBool():
        return provider.ConsumeBytes(provider.ConsumeIntInRange(0, 4096))
    entry = document["shards"][provider.ConsumeIntInRange(0, len(document["shards"]) - 1)]
    key = ("name", "records", "data_size", "index_size", "index_crc32c", "data_crc32c")[provider.ConsumeIntInRange(0, 5)]
    entry[key] = provider.ConsumeUnicodeNoSurrogates(40) if provider.ConsumeBool() else provider.ConsumeInt(9)
    return sealed_manifest(document) if provider.ConsumeBool() else json.dumps(document).encode()


def one_input(raw: bytes) -> None:
    provider = atheris.FuzzedDataProvider(raw)
    target = provider.ConsumeIntInRange(0, 2)
    if target == 2:
        directory, _, _ = base_dataset()
        (directory / "manifest.json").write_bytes(mutated_manifest(provider))
        assert_reads_agree(exercise_store(directory))
        return
    index, data = mutated_shard(provider) if target == 0 else msgpack_records_shard(provider)
    write_shard_files(WORKSPACE / "shard", index, data)
    for checked in (False, True):
        assert_reads_agree(exercise_store(WORKSPACE / "shard", verify_reads=checked))


def main() -> None:
    base_shards(), base_dataset()  # built before fuzzing starts, outside the coverage of an input
    try:
        atheris.Setup(sys.argv, one_input)
        atheris.Fuzz()
    finally:
        shutil.rmtree(WORKSPACE, ignore_errors=True)


if __name__ == "__main__":
    main()
