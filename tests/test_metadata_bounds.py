"""§1.4's memory rule: the structure of metadata (144 per `{`, 80 per `[`, 48 per `:`, 8 per `,`, outside strings)
costs at most 16 bytes per metadata byte plus 128 KiB, checked before parsing by varstore and the spec reader alike."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from varstore.errors import FormatError
from varstore.format.metadata import decode_metadata

from . import spec_reader

PER_BYTE, ALLOWANCE = 16, 128 << 10  # the rule as §1.4 states it
FRAME_COST = 144 * 3 + 48 * 3 + 8 * 1 + 80  # {"codec":{},"user":{"x":[...]}}: three objects, three members, one comma, the array


def _metadata_of(items: int) -> bytes:
    """Metadata whose user member holds a list of `items` empty objects: 152 of cost (`{` and `,`) for 3 bytes."""
    return b'{"codec":{},"user":{"x":[' + b",".join([b"{}"] * items) + b"]}}"


def _largest_passing_count() -> int:
    frame = len(_metadata_of(1)) - 2  # the bytes around the items: 3 a item, less the comma the first has not
    # cost FRAME_COST + 144 n + 8 (n - 1) <= 16 (frame + 3 n - 1) + ALLOWANCE
    return (PER_BYTE * (frame - 1) + ALLOWANCE - FRAME_COST + 8) // (144 + 8 - 3 * PER_BYTE)


def test_metadata_at_the_memory_limit_passes_and_one_object_more_is_refused():
    count = _largest_passing_count()
    at_limit, over = _metadata_of(count), _metadata_of(count + 1)
    assert decode_metadata(at_limit, path="shard.index")[1] == {"x": [{}] * count}
    with pytest.raises(FormatError, match=r"shard.index.*over the limit of 16 per byte \+ 131072"):
        decode_metadata(over, path="shard.index")
    spec_reader.parse_strict_json(at_limit, "§1.4")  # the reader written from the spec alone draws the same line
    with pytest.raises(spec_reader.SpecError, match="over 16 x its"):
        spec_reader.parse_strict_json(over, "§1.4")


def test_eight_mib_of_empty_objects_is_refused_before_parsing():
    with pytest.raises(FormatError, match="over the limit"):
        decode_metadata(_metadata_of((8 << 20) // 3), path="shard.index")


def _vocabulary(words: int) -> dict[str, int]:
    """A tokenizer's vocabulary of short words: 2 to 6 letters each, ids counting up."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return {letters[i % 26] + letters[i // 26 % 26] + "xyzw"[: i % 5] + str(i % 10): i for i in range(words)}


@pytest.mark.parametrize(
    "user",
    [
        {"vocab": _vocabulary(50_000)},
        {"numbers": list(range(200_000))},
        {"pairs": [[i, i + 1] for i in range(100_000)]},
        {"text": "x" * (1 << 20), "config": {"layers": 12, "heads": 12, "dropout": 0.1, "act": "gelu"}},
    ],
    ids=["vocabulary", "numbers", "pairs", "long string and config"],
)
def test_realistic_metadata_is_never_refused(user):
    raw = json.dumps({"codec": {}, "user": user}, separators=(",", ":")).encode()
    assert decode_metadata(raw, path="shard.index")[1] == user
    spec_reader.parse_strict_json(raw, "§1.4")


def test_a_repeated_member_name_is_refused_naming_it():
    with pytest.raises(FormatError, match="member name 'b' appears twice"):
        decode_metadata(b'{"codec":{},"user":{"a":{"b":1,"b":2}}}', path="shard.index")


MEASURE = textwrap.dedent("""
    import sys
    from varstore.format.metadata import decode_metadata

    def peak_rss_kib():  # this process's own high-water mark
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

    raw = open(sys.argv[1], "rb").read()
    before = peak_rss_kib()
    decode_metadata(raw, path=sys.argv[1])
    print(peak_rss_kib() - before)
""")


def test_peak_rss_of_parsing_metadata_at_the_limit_stays_within_the_bound(tmp_path):
    items = b",".join([b"{}"] * ((64 << 20) // 152))  # 64 MiB of cost in empty objects, then a string that lets it pass
    head, tail = b'{"codec":{},"user":{"x":[' + items + b'],"pad":"', b'"}}'
    cost = spec_reader.json_structure_cost((head + tail).decode())
    padding = -(-(cost - ALLOWANCE) // PER_BYTE) - len(head + tail)
    raw = head + b"x" * padding + tail
    decode_metadata(raw, path="m")
    (tmp_path / "metadata").write_bytes(raw)
    child = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "metadata")], capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 0, child.stderr
    grown = int(child.stdout) << 10
    assert grown <= 1.25 * (PER_BYTE * len(raw) + ALLOWANCE), f"{grown / len(raw):.1f} bytes per metadata byte"
