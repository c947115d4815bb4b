"""Any flipped, cut or added byte in either file is found by open or verify, and only ever as a VarstoreError."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import varstore

# Records in the middle, away from the first and last 4 KiB that open checks, so that damage
# there must be caught by the per-record checks and verify.
PAD_BYTES = 5000
RECORDS = {
    "bytes": [bytes(PAD_BYTES), b"alpha", b"", b"\x00\xff" * 40, b"omega", bytes(PAD_BYTES)],
    "msgpack": [
        {"pad": bytes(PAD_BYTES)},
        {"label": 1, "tokens": np.arange(5, dtype=np.uint16)},
        {"text": "héllo"},
        [1, 2.5, None],
        {"pad": bytes(PAD_BYTES)},
    ],
    "ndarray": [np.zeros(PAD_BYTES // 4, np.float32), np.arange(6, dtype=np.float32), np.zeros(0, np.float32), np.zeros(PAD_BYTES // 4, np.float32)],
}


def damage(original: bytes, kind: str, position: int, value: int) -> bytes:
    if kind == "flip":
        position %= len(original)
        return original[:position] + bytes([original[position] ^ value]) + original[position + 1 :]
    if kind == "truncate":
        return original[: position % len(original)]
    return original + bytes([value]) * (1 + position % 9)


def read_everything(reader) -> None:
    list(reader)
    reader.get_batch(range(len(reader)))
    reader.get_batch_flat(range(len(reader)))
    for batch in reader.iter_flat(2):
        batch.values.tobytes()
    for index in range(len(reader)):
        reader[index]
    reader.verify()


@pytest.mark.parametrize("codec", sorted(RECORDS))
def test_damage_to_either_file_is_detected_as_a_varstore_error(codec, tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine")
    options = {"dtype": "float32"} if codec == "ndarray" else {}
    with varstore.Writer(directory / "shard", codec=codec, **options) as writer:
        writer.extend(RECORDS[codec])
    pristine = {suffix: (directory / f"shard{suffix}").read_bytes() for suffix in (".index", ".data")}

    @settings(max_examples=150)
    @given(
        st.sampled_from([".index", ".data"]),
        st.sampled_from(["flip", "truncate", "extend"]),
        st.integers(0, 1 << 14),
        st.integers(1, 255),
    )
    def run(suffix, kind, position, value):
        work = tmp_path_factory.mktemp("damaged")
        for name, content in pristine.items():
            if name == suffix:
                content = damage(content, kind, position, value)
            (work / f"shard{name}").write_bytes(content)
        try:
            with varstore.open(work / "shard") as reader:
                read_everything(reader)
        except varstore.VarstoreError:
            return
        pytest.fail(f"{kind} of {suffix} at {position} went unnoticed")

    run()
