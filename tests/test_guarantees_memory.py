"""docs/guarantees.md, "Memory stays proportional to what you read": the figures that no other test pins down.

How many shards a dataset keeps mapped (max(8, (soft RLIMIT_NOFILE - 64) // 4)) is counted in /proc/self/maps of
a child process whose limit is set first; what an open dataset keeps of its manifest is traced with tracemalloc.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import varstore
from varstore.format.manifest import MANIFEST_NAME, manifest_crc32c

from .test_reader_metadata import traced_open

SHARDS = 20

COUNT_MAPPED = textwrap.dedent("""
    import gc, resource, sys
    import varstore

    soft = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    reader = varstore.open(sys.argv[1])
    for index in range(len(reader)):
        assert reader[index] == b"record %d" % index
    gc.collect()
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if line.rstrip().endswith(".data")}
    print(len(mapped), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
""")


def _mapped_shards_after_reading_every_record(directory: Path, soft_limit: int) -> int:
    child = subprocess.run(
        [sys.executable, "-c", COUNT_MAPPED, str(directory), str(soft_limit)], capture_output=True, text=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr
    mapped, soft_after = map(int, child.stdout.split())
    assert soft_after == soft_limit  # the open left the limit as it was
    return mapped


def test_a_dataset_keeps_at_most_a_quarter_of_the_spare_descriptors_mapped_and_never_fewer_than_eight(tmp_path):
    with varstore.ShardedWriter(tmp_path / "data", max_shard_records=1) as writer:
        writer.extend([b"record %d" % index for index in range(SHARDS)])
    # (128 - 64) // 4 = 16 of the 20 shards; (80 - 64) // 4 = 4, raised to the floor of 8.
    assert _mapped_shards_after_reading_every_record(tmp_path / "data", 128) == 16
    assert _mapped_shards_after_reading_every_record(tmp_path / "data", 80) == 8


def test_an_open_dataset_keeps_at_most_48_times_its_manifests_size(tmp_path):
    with varstore.Writer(tmp_path / "shard-a") as writer:
        writer.append(b"a")
    # The costliest JSON per byte that §1.4's rule accepts, written compactly as a hostile writer would.
    varstore.write_manifest(tmp_path, metadata={"x": {f"{number:x}": 0 for number in range(60_000)}})
    compact = json.dumps(json.loads((tmp_path / MANIFEST_NAME).read_text()), separators=(",", ":"))
    (tmp_path / MANIFEST_NAME).write_text(compact)
    dataset, _, held = traced_open(str(tmp_path))
    assert held <= 48 * len(compact) + (1 << 20)
    assert len(dataset.metadata["x"]) == 60_000


def _manifest_with_metadata_items(directory: Path, items: int) -> int:
    """Rewrite `directory`'s manifest, compactly, with metadata {"x": [{}, {}, ...]} of `items` empty objects;
    returns the file's size."""
    document = json.loads((directory / MANIFEST_NAME).read_text())
    document["metadata"] = {"x": [{}] * items}
    document.pop("crc32c")
    document["crc32c"] = manifest_crc32c(document)
    raw = json.dumps(document, separators=(",", ":")).encode()
    (directory / MANIFEST_NAME).write_bytes(raw)
    return len(raw)


def test_a_manifest_whose_containers_cost_more_than_16_per_byte_plus_128_kib_is_refused_at_open(tmp_path):
    with varstore.ShardedWriter(tmp_path / "data") as writer:
        writer.append(b"a")
    # Each further item is 3 bytes, "{},", that §1.4 counts at 144 + 8: at 100,000 of them the containers cost
    # 15.2 MB against 16 x 300 KB + 128 KiB = 4.9 MB.
    size = _manifest_with_metadata_items(tmp_path / "data", 100_000)
    assert 152 * 100_000 > 16 * size + (128 << 10)
    with pytest.raises(varstore.FormatError, match=r"manifest\.json.*over the limit of 16 per byte"):
        varstore.open(tmp_path / "data")
    _manifest_with_metadata_items(tmp_path / "data", 100)  # well within the allowance
    assert varstore.open(tmp_path / "data").metadata == {"x": [{}] * 100}
