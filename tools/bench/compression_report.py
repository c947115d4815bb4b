"""The compression benchmark's tables (markdown) and its JSON, from `compression.py`'s figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# (column title, figure, format)
COLUMNS = (
    ("stored ÷ raw ↓", "stored_ratio", "{:.3f}"),
    ("write MB/s ↑", "write_mb_s", "{:.0f}"),
    ("warm read µs ↓", "warm_read_us", "{:.1f}"),
    ("zstd decode alone µs (floor) ↓", "zstd_decode_us", "{:.1f}"),
    ("batch µs/record ↓", "batch_read_us", "{:.2f}"),
    ("cold open KB ↓", "cold_open_kb", "{:.0f}"),
    ("cold read µs ↓", "cold_read_us", "{:.0f}"),
    ("cold KB/record ↓", "cold_read_kb", "{:.1f}"),
    ("verify MB/s ↑", "verify_mb_s", "{:.0f}"),
)
VARSTORE = ("varstore", "varstore-zstd", "varstore-zstd-dict", "varstore-zstd-blocks", "varstore-zstd-dict-blocks",
            "varstore-auto")
COMPRESSED = VARSTORE[1:]
# The size goals: corpus -> (what it is, the factor over the best peer's stored size varstore meets)
SIZE_GOALS = {"documents": ("text documents", 1.10), "manpages": ("text documents", 1.10),
              "docstrings": ("~300 B records", 1.5), "metadata": ("~1 KB records", 1.5)}
# ... and its warm-read goals: a compressed read at most this many times an uncompressed one
READ_GOALS = {"documents": 2.0, "manpages": 2.0, "tokens": 2.0, "docstrings": 3.0, "metadata": 3.0}
BATCH_GOAL, COLD_GOAL, WRITE_GOAL = 1 / 3, 1.0, 0.5
INCOMPRESSIBLE = ("images",)


def _cell(figures: dict[str, Any], key: str, form: str) -> str:
    value = figures.get(key)
    return form.format(value) if isinstance(value, (int, float)) else "—"


def _smallest(row: dict[str, dict[str, Any]], peers: tuple[str, ...] | None) -> tuple[str, int] | None:
    """(peer, stored bytes) of the smallest store in `row`: among `peers`, or (None) among those not varstore."""
    sizes = [(peer, figures["stored_bytes"]) for peer, figures in row.items()
             if (peer in peers if peers else peer not in VARSTORE) and isinstance(figures.get("stored_bytes"), int)]
    return min(sizes, key=lambda item: item[1]) if sizes else None


def _mode(row: dict[str, dict[str, Any]], peer: str) -> str:
    """How a varstore peer's shard was stored: its compression, and for auto what it chose."""
    if peer == "varstore-auto":
        return f"auto (chose {row[peer].get('chosen')})"
    return peer.removeprefix("varstore-") if peer != "varstore" else "uncompressed"


def _met(value: float, goal: float, *, below: bool = True) -> str:
    """✓ when `value` meets `goal` (at most it, or with `below` false at least it), else ✗."""
    return "✓" if (value <= goal if below else value >= goal) else "✗"


def _size_goals(results: dict[str, Any]) -> list[str]:
    lines = ["| corpus | goal | best peer (stored) | varstore auto (stored, chosen) | auto ÷ best peer |"
             " best varstore mode (stored) | it ÷ best peer |", "|---|---|---|---|---:|---|---:|"]
    labels = results["meta"]["labels"]
    for corpus, row in results["figures"].items():
        auto = row.get("varstore-auto", {})
        best, ours = _smallest(row, None), _smallest(row, COMPRESSED)
        goal = _size_goal(corpus, row)
        if not isinstance(auto.get("stored_bytes"), int) or best is None or ours is None or goal is None:
            continue
        text, factor = goal
        ratio, our_ratio = auto["stored_bytes"] / best[1], ours[1] / best[1]
        marks = ("", "") if factor is None else (f" {_met(ratio, factor)}", f" {_met(our_ratio, factor)}")
        lines.append(f"| {corpus} | {text} | {labels.get(best[0], best[0])} ({best[1]:,} B) |"
                     f" {auto['stored_bytes']:,} B, {auto.get('chosen')} | {ratio:.2f}×{marks[0]} |"
                     f" {_mode(row, ours[0])} ({ours[1]:,} B) | {our_ratio:.2f}×{marks[1]} |")
    return lines


def _size_goal(corpus: str, row: dict[str, dict[str, Any]]) -> tuple[str, float | None] | None:
    """The size goal's wording for `corpus` and the factor over the best peer it sets: an incompressible corpus's
    goal is auto's size against uncompressed varstore's, met by storing it raw (a few hundred bytes of metadata over
    uncompressed varstore: what auto measured) or smaller, met or not in the wording (no factor)."""
    if corpus in SIZE_GOALS:
        what, factor = SIZE_GOALS[corpus]
        return f"≤ {factor}× best peer ({what})", factor
    plain, auto = row.get("varstore", {}).get("stored_bytes"), row.get("varstore-auto", {}).get("stored_bytes")
    if corpus not in INCOMPRESSIBLE or not isinstance(plain, int) or not isinstance(auto, int):
        return None
    chosen = row["varstore-auto"].get("chosen")
    met = "✓" if chosen == "none" or auto <= plain else "✗"
    return f"auto ≤ uncompressed varstore ({plain:,} B), or raw: {auto / plain:.4f}×, {chosen} {met}", None


def _ratio(row: dict[str, dict[str, Any]], peer: str, key: str, other_peer: str, other_key: str) -> float | None:
    value, other = row.get(peer, {}).get(key), row.get(other_peer, {}).get(other_key)
    return value / other if isinstance(value, (int, float)) and isinstance(other, (int, float)) and other else None


def _goal_cell(value: float | None, goal: float | None, *, below: bool = True) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" + ("" if goal is None else f" {_met(value, goal, below=below)}")


def _speed_row(corpus: str, row: dict[str, dict[str, Any]], peer: str) -> str:
    """One compressed varstore mode's read and write goals on `corpus`, against uncompressed varstore."""
    figures, plain = row[peer], row.get("varstore", {})
    micros = " / ".join(_cell(source, key, "{:.2f}") for source, key in
                        ((plain, "warm_read_us"), (figures, "warm_read_us"), (figures, "zstd_decode_us")))
    cells = [_goal_cell(_ratio(row, peer, "warm_read_us", "varstore", "warm_read_us"), READ_GOALS.get(corpus)),
             _goal_cell(_ratio(row, peer, "zstd_decode_us", "varstore", "warm_read_us"), None),
             _goal_cell(_ratio(row, peer, "zstd_decode_us", peer, "warm_read_us"), None),
             _goal_cell(_ratio(row, peer, "batch_read_us", peer, "warm_read_us"), BATCH_GOAL),
             _goal_cell(_ratio(row, peer, "cold_read_kb", "varstore", "cold_read_kb"), COLD_GOAL),
             _goal_cell(_ratio(row, peer, "write_mb_s", "varstore", "write_mb_s"), WRITE_GOAL, below=False)]
    return f"| {corpus} | {_mode(row, peer)} | {micros} | " + " | ".join(cells) + " |"


def _speed_goals(results: dict[str, Any]) -> list[str]:
    """The issue's read and write goals for each compressed varstore mode against uncompressed varstore, per
    compressed corpus, with the floor of a read: python-zstandard's own decode of the frame the read decodes."""
    header = ("| corpus | mode | warm read µs: uncompressed / this mode / zstd decode alone (floor) |"
              " read ÷ uncompressed (goal ≤ 2× documents, ≤ 3× small) | floor ÷ uncompressed | floor ÷ read |"
              " batch ÷ single per record (goal ≤ 0.33) | cold KB/record ÷ uncompressed (goal < 1) |"
              " write ÷ uncompressed (goal ≥ 0.5) |")
    lines = [header, "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for corpus, row in results["figures"].items():
        if corpus in INCOMPRESSIBLE:
            continue
        lines += [_speed_row(corpus, row, peer) for peer in COMPRESSED if "warm_read_us" in row.get(peer, {})]
    return lines


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    labels = meta["labels"]
    lines = [(f"Command: `{meta['command']}` ({meta['minutes']:.0f} min; load average before {meta['load_before']}, "
              f"after {meta['load_after']}; {meta.get('cpu', '')}, {meta.get('cores', '')} cores)."), ""]
    versions = meta.get("versions")
    if versions:
        lines += ["Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()) + ".", ""]
    lines += ["Size goals (stored bytes: every file the library wrote):", "", *_size_goals(results), "",
              "Read and write goals (ratios within this run):", "", *_speed_goals(results), ""]
    for corpus, row in results["figures"].items():
        about = results["corpora"][corpus]
        lines += [(f"**{corpus}**: {about['records']:,} records, {about['raw_bytes'] / 1e6:.1f} MB raw "
                   f"({about['raw_bytes'] / max(1, about['records']):,.0f} B mean). {about['description']}"), "",
                  "| peer | " + " | ".join(title for title, _, _ in COLUMNS) + " |",
                  "|---|" + "---:|" * len(COLUMNS)]
        for peer, figures in row.items():
            name = labels.get(peer, peer)
            if "chosen" in figures and peer == "varstore-auto":
                name += f" (chose {figures['chosen']})"
            if "error" in figures:
                lines.append(f"| {name} | " + figures["error"].replace("|", "/")[:200] + " |" + " |" * (len(COLUMNS) - 1))
                continue
            lines.append(f"| {name} | " + " | ".join(_cell(figures, key, form) for _, key, form in COLUMNS) + " |")
        lines.append("")
    return "\n".join(lines)


def write(results: dict[str, Any], destinations: list[Path]) -> str:
    """Write compression.json and compression.md to each destination; returns the markdown."""
    table = markdown(results)
    for destination in destinations:
        destination.mkdir(parents=True, exist_ok=True)
        (destination / "compression.json").write_text(json.dumps(results, indent=1) + "\n")
        (destination / "compression.md").write_text(table + "\n")
    return table
