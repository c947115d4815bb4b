"""``varstore stats``: size figures and histograms checked against values computed here from the records written."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers_cli import assert_one_line_error, run, run_json, write_dataset, write_shard


def _percentile(sorted_sizes: list[int], percent: float) -> int:
    """Smallest size with at least `percent`% of sizes at or below it, by counting."""
    return next(
        size for size in sorted_sizes
        if 100 * sum(1 for other in sorted_sizes if other <= size) >= Fraction(str(percent)) * len(sorted_sizes)
    )


def _power_of_two_bin(size: int) -> tuple[int, int]:
    return (0, 1) if size == 0 else (1 << (size.bit_length() - 1), 1 << size.bit_length())


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40))
def test_figures_and_power_of_two_histogram_match_the_sizes_written(capsys, tmp_path_factory, sizes):
    dataset = write_dataset(tmp_path_factory.mktemp("stats") / "ds", [b"x" * size for size in sizes], max_shard_records=7)
    facts = run_json(capsys, "stats", dataset)
    ordered = sorted(sizes)
    assert (facts["records"], facts["total_bytes"]) == (len(sizes), sum(sizes))
    assert (facts["min"], facts["max"]) == (ordered[0], ordered[-1])
    assert math.isclose(facts["mean"], sum(sizes) / len(sizes))
    assert facts["percentiles"] == {f"p{percent:g}": _percentile(ordered, percent) for percent in (50, 90, 99, 99.9)}
    histogram = {(row["low"], row["high"]): row["count"] for row in facts["histogram"]}
    for size_bin in {_power_of_two_bin(size) for size in sizes}:
        assert histogram[size_bin] == sum(1 for size in sizes if _power_of_two_bin(size) == size_bin)
    assert sum(histogram.values()) == len(sizes)
    lows = [row["low"] for row in facts["histogram"]]
    assert lows[0] == _power_of_two_bin(ordered[0])[0] and facts["histogram"][-1]["high"] == _power_of_two_bin(ordered[-1])[1]
    assert all(row["high"] == following["low"] for row, following in zip(facts["histogram"], facts["histogram"][1:]))


def test_equal_width_bins_cover_min_to_max(capsys, tmp_path):
    sizes = [10, 11, 15, 19, 20, 29, 30]
    shard = write_shard(tmp_path / "s", [b"x" * size for size in sizes])
    facts = run_json(capsys, "stats", shard, "--bins", "3")
    assert [(row["low"], row["high"], row["count"]) for row in facts["histogram"]] == [(10, 17, 3), (17, 24, 2), (24, 31, 2)]


def test_text_histogram_draws_the_fullest_bin_fifty_wide(capsys, tmp_path):
    shard = write_shard(tmp_path / "s", [b"x" * 100] * 8 + [b"x" * 1000] * 2)
    code, out, _ = run(capsys, "stats", shard)
    assert code == 0
    lines = out.splitlines()
    assert "p50      100 bytes" in lines and "p90      1,000 bytes" in lines
    rows = {line.split()[0]: line for line in lines if line.startswith("  64 - 127") or line.startswith("  512 - 1,023")}
    assert len(rows) == 2
    assert rows["64"].count("#") == 50 and rows["512"].count("#") == math.ceil(2 * 50 / 8)


def test_empty_store_has_count_and_no_histogram(capsys, tmp_path):
    shard = write_shard(tmp_path / "empty", [])
    facts = run_json(capsys, "stats", shard)
    assert facts == {"records": 0, "total_bytes": 0, "min": None, "mean": None, "max": None, "percentiles": {},
                     "histogram": [], "lengths": None,
                     "shards": [{"name": str(shard), "compression": "none", "stored_bytes": 0, "raw_bytes": 0, "ratio": 1.0}]}


def test_plot_draws_a_png(capsys, tmp_path):
    shard = write_shard(tmp_path / "s", [b"x" * size for size in range(1, 300)])
    code, out, err = run(capsys, "stats", shard, "--plot", tmp_path / "sizes.png")
    assert code == 0, err
    assert (tmp_path / "sizes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"histogram drawn in {tmp_path / 'sizes.png'}" in out


def test_plot_without_matplotlib_names_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = run(capsys, "stats", write_shard(tmp_path / "s", [b"x"]), "--plot", tmp_path / "sizes.png")
    assert_one_line_error(code, err, "stats --plot needs matplotlib", "pip install 'varstore[plot]'")
    assert not (tmp_path / "sizes.png").exists()


def test_ndarray_sizes_are_in_bytes(capsys, tmp_path):
    shard = write_shard(tmp_path / "t", [np.zeros(length, np.uint16) for length in (1, 5, 9)], codec="ndarray", dtype="uint16")
    facts = run_json(capsys, "stats", shard)
    assert (facts["min"], facts["max"], facts["total_bytes"]) == (2, 18, 30)
