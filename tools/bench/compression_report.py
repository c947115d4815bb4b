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
    ("batch µs/record ↓", "batch_read_us", "{:.2f}"),
    ("cold open KB ↓", "cold_open_kb", "{:.0f}"),
    ("cold read µs ↓", "cold_read_us", "{:.0f}"),
    ("cold KB/record ↓", "cold_read_kb", "{:.1f}"),
    ("verify MB/s ↑", "verify_mb_s", "{:.0f}"),
)
VARSTORE = ("varstore", "varstore-zstd", "varstore-zstd-dict", "varstore-auto")
# The size goals: corpus -> (what it is, the factor over the best peer's stored size varstore "auto" meets)
SIZE_GOALS = {"documents": ("text documents", 1.10), "manpages": ("text documents", 1.10),
              "docstrings": ("~300 B records", 1.5), "metadata": ("~1 KB records", 1.5)}
INCOMPRESSIBLE = ("images",)


def _cell(figures: dict[str, Any], key: str, form: str) -> str:
    value = figures.get(key)
    return form.format(value) if isinstance(value, (int, float)) else "—"


def _best_peer(row: dict[str, dict[str, Any]]) -> tuple[str, float] | None:
    sizes = [(peer, figures["stored_bytes"]) for peer, figures in row.items()
             if peer not in VARSTORE and isinstance(figures.get("stored_bytes"), int)]
    return min(sizes, key=lambda item: item[1]) if sizes else None


def _size_goals(results: dict[str, Any]) -> list[str]:
    lines = ["| corpus | goal | best peer (stored) | varstore auto (stored, chosen) | ratio | met |", "|---|---|---|---|---|---|"]
    labels = results["meta"]["labels"]
    for corpus, row in results["figures"].items():
        auto = row.get("varstore-auto", {})
        if not isinstance(auto.get("stored_bytes"), int):
            continue
        chosen = f"{auto['stored_bytes']:,} B, {auto.get('chosen')}"
        if corpus in INCOMPRESSIBLE:
            plain = row.get("varstore", {}).get("stored_bytes", 0)
            lines.append(f"| {corpus} | auto stores it raw (uncompressed varstore: {plain:,} B) | — | {chosen} |"
                         f" {auto['stored_bytes'] / plain:.4f} | {'yes' if auto.get('chosen') == 'none' else 'no'} |")
            continue
        best = _best_peer(row)
        if corpus not in SIZE_GOALS or best is None:
            continue
        what, factor = SIZE_GOALS[corpus]
        ratio = auto["stored_bytes"] / best[1]
        lines.append(f"| {corpus} | ≤ {factor}× best peer ({what}) | {labels.get(best[0], best[0])} ({best[1]:,} B) |"
                     f" {chosen} | {ratio:.2f}× | {'yes' if ratio <= factor else 'no'} |")
    return lines


def _ratio(row: dict[str, dict[str, Any]], peer: str, key: str, other_peer: str, other_key: str) -> float | None:
    value, other = row.get(peer, {}).get(key), row.get(other_peer, {}).get(other_key)
    return value / other if isinstance(value, (int, float)) and isinstance(other, (int, float)) and other else None


def _speed_goals(results: dict[str, Any]) -> list[str]:
    """The issue's read and write goals for varstore auto against uncompressed varstore, per compressed corpus."""
    header = ("| corpus | auto warm read ÷ uncompressed (goal ≤ 2× documents, ≤ 3× small) | auto batch ÷ single per record"
              " (goal ≤ 1/3) | auto cold KB/record ÷ uncompressed (goal < 1) | zstd write ÷ uncompressed (goal ≥ 0.5) |")
    lines = [header, "|---|---:|---:|---:|---:|"]
    for corpus, row in results["figures"].items():
        if corpus in INCOMPRESSIBLE:
            continue
        cells = [_ratio(row, "varstore-auto", "warm_read_us", "varstore", "warm_read_us"),
                 _ratio(row, "varstore-auto", "batch_read_us", "varstore-auto", "warm_read_us"),
                 _ratio(row, "varstore-auto", "cold_read_kb", "varstore", "cold_read_kb"),
                 _ratio(row, "varstore-zstd", "write_mb_s", "varstore", "write_mb_s")]
        lines.append(f"| {corpus} | " + " | ".join("—" if cell is None else f"{cell:.2f}" for cell in cells) + " |")
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
