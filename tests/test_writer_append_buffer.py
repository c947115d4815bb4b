"""The append path buffers payloads and checksums them at the flush: what is stored is what was appended, when."""

from __future__ import annotations

import numpy as np

import varstore


def test_a_payload_its_owner_changes_after_append_is_stored_as_appended(tmp_path):
    reused = bytearray(b"first")
    array = np.arange(4, dtype=np.int32)
    with varstore.Writer(tmp_path / "bytes", checksums=True) as writer:
        writer.append(reused)
        writer.append(memoryview(reused))
        reused[:] = b"later"
    with varstore.Writer(tmp_path / "arrays", codec="ndarray", dtype="int32") as arrays:
        arrays.append(array)
        array[:] = -1
    assert list(varstore.open(tmp_path / "bytes")) == [b"first", b"first"]
    assert varstore.open(tmp_path / "arrays")[0].tolist() == [0, 1, 2, 3]
    varstore.open(tmp_path / "bytes").verify()


def test_many_empty_and_small_records_across_flushes_keep_offsets_and_checksums_in_order(tmp_path):
    records = [bytes([index % 251]) * (index % 7) for index in range(50_000)] + [b"x" * (3 << 20), b"", b"tail"]
    with varstore.ShardedWriter(tmp_path / "dataset", max_shard_records=20_000) as writer:
        for record in records[:30_000]:
            writer.append(record)
        writer.extend_flat(b"".join(records[30_000:40_000]), [len(record) for record in records[30_000:40_000]])
        writer.extend(records[40_000:])
    dataset = varstore.open(tmp_path / "dataset")
    assert list(dataset) == records
    dataset.verify()
