"""``varstore stats``: the distribution of record sizes, as figures, a text histogram and optionally a PNG
(`varstore.operations.statistics`)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import require_extra
from ..operations.statistics import statistics
from .arguments import add_store_arguments, command_parser, positive_int
from .output import (
    format_count,
    format_size,
    format_size_exactly,
    print_fields,
    print_json,
    print_table,
    writing_to_standard_output,
)
from .stores import REMOTE_EPILOG, add_location_options, check_location_options, location_options

_BAR_WIDTH = 50
_DESCRIPTION = """Record count and payload sizes: total, min, mean, percentiles, max, and a histogram of record
sizes (bins between powers of two unless --bins asks for equal widths); for ndarray stores each figure also in rows
(tokens for integer records of shape (L,)). Reads every record offset, never a payload (at a URL: each shard's
index, fetched whole into the node cache). Sizes are those the records decode to; when a shard is compressed, each
shard's stored bytes and its ratio of stored to raw bytes are listed too."""


def add_parser(commands: Any) -> None:
    parser = command_parser(commands, "stats", run, help="record size statistics and histogram",
                            description=_DESCRIPTION, epilog=REMOTE_EPILOG)
    add_store_arguments(parser)
    add_location_options(parser)
    parser.add_argument("--bins", type=positive_int, metavar="N", help="N bins of equal width instead of powers of two")
    parser.add_argument("--plot", metavar="FILE.png", help="also draw the histogram into an image (needs matplotlib)")


def _bin_label(low: int, high: int) -> str:
    return f"{low:,}" if high == low + 1 else f"{low:,} - {high - 1:,}"


def _in_rows(size_text: str, rows: float | None, unit: str | None) -> str:
    """``22 bytes, 11 tokens``: a size, followed for ndarray stores by the same figure in rows."""
    if unit is None or rows is None:
        return size_text
    count = f"{rows:,.1f}" if isinstance(rows, float) else format_count(rows)
    return f"{size_text}, {count} {unit.removesuffix('s') if rows == 1 else unit}"


def _print_text(facts: dict[str, Any]) -> None:
    lengths = facts["lengths"] or {}
    unit, row_percentiles = lengths.get("unit"), lengths.get("percentiles", {})
    fields = [("records", format_count(facts["records"])),
              ("total", _in_rows(format_size_exactly(facts["total_bytes"]), lengths.get("total"), unit))]
    if facts["records"]:
        fields += [("min", _in_rows(format_size_exactly(facts["min"]), lengths.get("min"), unit)),
                   ("mean", _in_rows(f"{facts['mean']:,.1f} bytes", lengths.get("mean"), unit))]
        fields += [(name, _in_rows(format_size_exactly(value), row_percentiles.get(name), unit))
                   for name, value in facts["percentiles"].items()]
        fields += [("max", _in_rows(format_size_exactly(facts["max"]), lengths.get("max"), unit))]
    print_fields(fields)
    if not facts["histogram"]:
        return
    print("record sizes in bytes")
    most = max(row["count"] for row in facts["histogram"])
    rows = []
    for row in facts["histogram"]:
        bar = "#" * (-(-row["count"] * _BAR_WIDTH // most))
        rows.append([_bin_label(row["low"], row["high"]), format_count(row["count"]), bar])
    print_table(["size", "records", ""], rows, align="lrl", indent="  ")
    if any(shard["compression"] != "none" for shard in facts["shards"]):
        print("shards (stored: the data file's bytes; raw: what its records decode to)")
        print_table(["name", "compression", "stored", "raw", "stored/raw"],
                    [[shard["name"], shard["compression"], format_size(shard["stored_bytes"]), format_size(shard["raw_bytes"]),
                      f"{shard['ratio']:.3f}"] for shard in facts["shards"]],
                    align="llrrr", indent="  ")


def _plot(facts: dict[str, Any], title: str, path: str) -> None:
    matplotlib = require_extra("matplotlib", "plot", "stats --plot")
    matplotlib.use("Agg")
    pyplot = require_extra("matplotlib.pyplot", "plot", "stats --plot")
    rows = facts["histogram"]
    figure, axes = pyplot.subplots(figsize=(10, 4.5))
    axes.bar(range(len(rows)), [row["count"] for row in rows], color="tab:blue")
    axes.set_xticks(range(len(rows)), [_bin_label(row["low"], row["high"]) for row in rows], rotation=45, ha="right")
    axes.set_xlabel("record size (bytes)")
    axes.set_ylabel("records")
    axes.set_title(f"{title}: {format_count(facts['records'])} records, {format_size(facts['total_bytes'])}")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def run(args: argparse.Namespace) -> int:
    check_location_options(args, args.path)
    facts = statistics(args.path, bins=args.bins, **location_options(args)).as_json()
    if args.plot:
        _plot(facts, args.path, args.plot)
        facts["plot"] = args.plot
    with writing_to_standard_output():
        if args.json:
            print_json(facts)
        else:
            _print_text(facts)
            if args.plot:
                print(f"histogram drawn in {args.plot}")
    return 0
