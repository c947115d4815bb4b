"""§2.2's memory rule: decoding a msgpack record costs at most 16 bytes per record byte plus 128 KiB.

A record whose objects cost more by §2.2's count (empty maps, short strings, small
numbers, each a Python object of 40-300 bytes for one to a few bytes) is refused,
before anything is built, by the Python check and the C extension alike.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest

import varstore
from varstore.format.codecs import MsgpackCodec
from varstore.format.msgpack_bounds import check_msgpack

from . import spec_reader
from .test_untrusted_input import msgpack_shard

PER_BYTE, ALLOWANCE = 16, 128 << 10  # the rule as §2.2 states it


def _array32(items: list[bytes]) -> bytes:
    return b"\xdd" + struct.pack(">I", len(items)) + b"".join(items)


def _largest_passing(item: bytes, item_cost: int) -> bytes:
    """An array32 of as many `item`s as §2.2's rule allows (its own cost: 80, plus item_cost per item)."""
    count = (PER_BYTE * 5 + ALLOWANCE - 80) // (item_cost - PER_BYTE * len(item))
    return _array32([item] * count)


# The costliest items per byte, with their cost computed from §2.2's table (not from the code).
WORST_ITEMS = {
    "empty maps": (b"\x80", 144 + 0),
    "empty lists": (b"\x90", 80),
    "one-entry maps, negative fixint keys": (b"\x81\xe0\xc0", 144 + 72 + 40 + 8),
    "0-d arrays": (b"\xc7\x06\x01\x03|b1\x00\x01", 288 + 3 * 6),
    "two-letter strings": (b"\xa2ab", 72 + 2),
    "one-letter non-ASCII strings": (b"\xa3\xe2\x82\xac", 88 + 4 * 3),
    "negative fixints": (b"\xe0", 40),
}


@pytest.mark.parametrize("name", sorted(WORST_ITEMS))
def test_a_record_at_the_memory_limit_passes_and_one_item_more_is_refused(name):
    item, cost = WORST_ITEMS[name]
    at_limit = _largest_passing(item, cost)
    check_msgpack(at_limit, 1)
    over = _array32([item] * (struct.unpack(">I", at_limit[1:5])[0] + 1))
    with pytest.raises(ValueError, match="over the limit of 16 per payload byte"):
        check_msgpack(over, 1)
    spec_reader.decode_msgpack(at_limit)  # the reader written from the spec alone draws the same line
    with pytest.raises(spec_reader.SpecError, match="over 16 x its"):
        spec_reader.decode_msgpack(over)


def test_a_shard_of_empty_maps_is_refused_on_read_naming_the_record_and_the_limit(tmp_path):
    hostile = _array32([b"\x80"] * ((1900 << 10) - 5))  # 1.9 MiB: 72 bytes of objects a byte, 140 MiB decoded
    prefix = tmp_path / "records"
    msgpack_shard(prefix, [MsgpackCodec().encode({"ok": 1}), hostile])
    with varstore.open(prefix) as reader:
        assert reader[0] == {"ok": 1}
        with pytest.raises(varstore.CorruptRecordError, match=r"record 1 does not decode as msgpack: .*over the limit of 16"):
            reader[1]
        with pytest.raises(varstore.CorruptRecordError) as caught:
            reader.verify()
        assert caught.value.records == [1]


def test_the_writer_refuses_a_record_over_the_memory_limit():
    with pytest.raises(varstore.RecordTypeError, match="over the limit of 16 per payload byte"):
        MsgpackCodec().encode([{}] * 100_000)


MEASURE = textwrap.dedent("""
    import sys
    from varstore.format.codecs import MsgpackCodec

    def peak_rss_kib():  # this process's own high-water mark (ru_maxrss would include the parent's, from before exec)
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

    payload = open(sys.argv[1], "rb").read()
    before = peak_rss_kib()
    record = MsgpackCodec().decode(payload, 0, len(payload))
    print(peak_rss_kib() - before)
""")


@pytest.mark.parametrize("name", ["empty maps", "0-d arrays", "one-entry maps, negative fixint keys", "two-letter strings"])
def test_peak_rss_of_decoding_a_record_at_the_limit_stays_within_the_bound(tmp_path, name):
    item, cost = WORST_ITEMS[name]
    count = (64 << 20) // cost  # 64 MiB of the costliest objects, then a bin long enough that the record passes
    # cost: 80 (the outer array) + 80 (the inner one) + count * cost + 56 + padding, against 16 per byte of
    # 1 + 5 + count * len(item) + 5 + padding bytes (the allowance left over)
    padding = -(-(count * cost + 216 - PER_BYTE * (11 + count * len(item))) // (PER_BYTE - 1))
    record = b"\x92" + _array32([item] * count) + b"\xc6" + struct.pack(">I", padding) + bytes(padding)
    check_msgpack(record, 1)
    (tmp_path / "record").write_bytes(record)
    child = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "record")], capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 0, child.stderr
    grown = int(child.stdout) << 10
    assert grown <= 1.25 * (PER_BYTE * len(record) + ALLOWANCE), f"{grown / len(record):.1f} bytes per record byte"
