"""From raw figures to what people read: the markdown table, the bars with pass/miss, the PNG chart, the JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .peers import PEER_MODULES, REFERENCES

LABELS = {
    "varstore": "varstore", "floor": "raw floor", "megatron": "Megatron", "hf-datasets": "HF datasets",
    "lmdb": "LMDB", "h5py": "h5py", "mds": "MDS", "litdata": "litdata", "lance": "Lance",
    "list": "list in RAM",
}
WORKLOADS = ("tokens", "blobs", "small", "structured")
FLAT_WORKLOADS = ("tokens", "blobs", "small")
LOWER, HIGHER = "lower", "higher"


@dataclass(frozen=True)
class Row:
    """One table row: `keys` are tried in order (variants name their figure differently per peer)."""

    label: str
    workload: str
    keys: tuple[str, ...]
    better: str
    scale: float = 1.0

    def value(self, figures: dict[str, Any]) -> float | None:
        found = figures.get(self.workload, {})
        for key in self.keys:
            if isinstance(found.get(key), (int, float)):
                return found[key] * self.scale
        return None


def _per_workload(label: str, keys: tuple[str, ...], better: str, names: Iterable[str] = WORKLOADS, scale: float = 1.0) -> list[Row]:
    return [Row(f"{label}, {name}", name, keys, better, scale) for name in names]


ROWS: list[tuple[str, list[Row]]] = [
    ("Write", [
        *_per_workload("write MB/s ↑ (varstore: extend)", ("write_mb_s",), HIGHER),
        *_per_workload("write MB/s ↑, varstore append per record", ("write_mb_s@append",), HIGHER, FLAT_WORKLOADS),
        *_per_workload("write MB/s ↑, varstore extend_flat", ("write_mb_s@extend_flat",), HIGHER, FLAT_WORKLOADS),
        *_per_workload("on-disk overhead % ↓", ("overhead",), LOWER, scale=100),
    ]),
    ("Open (small records)", [
        Row("open ms ↓, 1× records", "small-1x", ("open_ms",), LOWER),
        Row("open ms ↓, 100× records", "small", ("open_ms",), LOWER),
        Row("RSS growth on open MB ↓, 1×", "small-1x", ("rss_open_mb",), LOWER),
        Row("RSS growth on open MB ↓, 100×", "small", ("rss_open_mb",), LOWER),
        Row("of which private (RssAnon) MB ↓, 1×", "small-1x", ("rss_anon_open_mb",), LOWER),
        Row("of which private (RssAnon) MB ↓, 100×", "small", ("rss_anon_open_mb",), LOWER),
    ]),
    ("Warm random reads", [
        *_per_workload("single read µs/record ↓", ("warm_read_us",), LOWER),
        *_per_workload("batch of 256 µs/record ↓ (varstore get_batch)", ("batch_read_us",), LOWER),
        *_per_workload("batch of 256 µs/record ↓, varstore get_batch_flat", ("batch_read_us@flat",), LOWER, FLAT_WORKLOADS),
        *_per_workload("batch of 256 µs/record ↓, varstore get_batch + concatenate", ("batch_read_us@concat",), LOWER,
                       FLAT_WORKLOADS),
    ]),
    ("Cold random reads (page cache evicted)", [
        *_per_workload("open ms ↓ (cold)", ("cold_open_ms",), LOWER),
        *_per_workload("KB read from disk by open ↓", ("cold_open_kb",), LOWER),
        *_per_workload("µs/record ↓ (library default madvise)", ("cold_read_us",), LOWER),
        *_per_workload("KB read from disk/record ↓", ("cold_read_kb",), LOWER),
        *_per_workload("µs/record ↓, varstore MADV_NORMAL / floor MADV_RANDOM", ("cold_read_us@normal", "cold_read_us@random"),
                       LOWER),
        *_per_workload("KB/record ↓, varstore MADV_NORMAL / floor MADV_RANDOM", ("cold_read_kb@normal", "cold_read_kb@random"),
                       LOWER),
        *_per_workload("µs/record ↓, varstore with its index map MADV_NORMAL", ("cold_read_us@index-normal",), LOWER),
        *_per_workload("KB/record ↓, varstore with its index map MADV_NORMAL", ("cold_read_kb@index-normal",), LOWER),
    ]),
    ("Sequential scan (warm)", [
        *_per_workload("MB/s ↑ (floor: one record at a time)", ("scan_mb_s",), HIGHER),
        *_per_workload("MB/s ↑, varstore iter_flat (one copy per 4,096 records)", ("scan_mb_s@flat",), HIGHER),
    ]),
    ("Checksum verification (warm)", [
        *_per_workload("MB/s ↑ (floor: bare CRC32C of the data file)", ("verify_mb_s",), HIGHER),
    ]),
    ("DataLoader, tokens, batches of 64, random order", [
        *[Row(f"samples/s ↑, {workers} workers", "tokens", (f"loader_samples_s@{workers}w",), HIGHER) for workers in (0, 1, 2)],
        *[Row(f"samples/s ↑, {workers} workers, varstore flat_batches", "tokens", (f"loader_samples_s@{workers}w@flat",), HIGHER)
          for workers in (0, 1, 2)],
        *[Row(f"PSS MB ↓, main + {workers} workers", "tokens", (f"loader_pss_mb@{workers}w",), LOWER) for workers in (0, 1, 2)],
    ]),
    ("Token windows (seq_len 2048, batches of 8)", [
        Row("windows/s ↑", "tokens", ("windows_s",), HIGHER),
    ]),
]


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{min(digits, 3)}f}"


def _ratio(value: float | None, other: float | None) -> str:
    if value is None or not other:
        return "–"
    return f"{value / other:.2f}×"


def _best(row: Row, peers: dict[str, Any]) -> tuple[str, float] | None:
    """The best real peer for `row` (the floor and the list in RAM are references, not peers)."""
    candidates = [(name, row.value(result["figures"])) for name, result in peers.items()
                  if name not in REFERENCES and name != "varstore" and result.get("figures")]
    found = [(name, value) for name, value in candidates if value is not None]
    if not found:
        return None
    pick = min if row.better == LOWER else max
    return pick(found, key=lambda pair: pair[1])


def _cell(row: Row, result: dict[str, Any]) -> str:
    if result.get("skipped"):
        return "skip"
    found = result.get("figures", {}).get(row.workload, {})
    if "unsupported" in found:
        return "n/a"
    if "error" in found and row.value(result["figures"]) is None:
        return "err"
    return _number(row.value(result["figures"]))


def table(results: dict[str, Any]) -> str:
    peers = results["peers"]
    names = [name for name in PEER_MODULES if name in peers]
    header = ["figure", *[LABELS[name] for name in names], "varstore ÷ floor", "varstore ÷ best peer (which)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for section, rows in ROWS:
        lines.append(f"| **{section}** |" + " |" * (len(header) - 1))
        for row in rows:
            cells = [_cell(row, peers[name]) for name in names]
            if all(cell in ("–", "skip", "n/a") for cell in cells):
                continue
            mine = row.value(peers["varstore"]["figures"]) if "varstore" in peers else None
            floor = row.value(peers["floor"]["figures"]) if "floor" in peers else None
            best = _best(row, peers)
            best_text = f"{_ratio(mine, best[1])} ({LABELS[best[0]]})" if best else "–"
            lines.append("| " + " | ".join([row.label, *cells, _ratio(mine, floor), best_text]) + " |")
    return "\n".join(lines)


def _figure(results: dict[str, Any], peer: str, workload: str, key: str) -> float | None:
    value = results["peers"].get(peer, {}).get("figures", {}).get(workload, {}).get(key)
    return value if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Bar:
    """A target from issue 5: `measure` returns (figure as text, passed) or None when not measured."""

    text: str
    measure: Callable[[dict[str, Any]], tuple[str, bool] | None]


def _ratio_bar(workloads: Iterable[str], numerator: tuple[str, str], denominator: tuple[str, str],
               passes: Callable[[float], bool]) -> Callable[[dict[str, Any]], tuple[str, bool] | None]:
    """A bar on numerator ÷ denominator per workload, each a (peer, key); it passes if every workload does."""
    def evaluate(results: dict[str, Any]) -> tuple[str, bool] | None:
        parts = []
        for workload in workloads:
            top, bottom = _figure(results, numerator[0], workload, numerator[1]), _figure(results, denominator[0], workload, denominator[1])
            if top is not None and bottom:
                parts.append((workload, top / bottom))
        if not parts:
            return None
        return ", ".join(f"{workload} {value:.2f}×" for workload, value in parts), all(passes(value) for _, value in parts)
    return evaluate


def _value_bar(workload: str, peer: str, key: str, unit: str, passes: Callable[[float], bool]) -> Callable[[dict[str, Any]], tuple[str, bool] | None]:
    def evaluate(results: dict[str, Any]) -> tuple[str, bool] | None:
        value = _figure(results, peer, workload, key)
        return None if value is None else (f"{_number(value)} {unit}", passes(value))
    return evaluate


def _sizes_bar(key: str, describe: Callable[[float, float], str],
               passes: Callable[[float, float], bool]) -> Callable[[dict[str, Any]], tuple[str, bool] | None]:
    """A bar comparing varstore's `key` on small records at 1× and at 100× the records."""
    def evaluate(results: dict[str, Any]) -> tuple[str, bool] | None:
        small, large = (_figure(results, "varstore", name, key) for name in ("small-1x", "small"))
        if small is None or large is None:
            return None
        return describe(small, large), passes(small, large)
    return evaluate


VS = "varstore"
BARS = [
    Bar("warm random single read ≤ 1.3× the floor",
        _ratio_bar(WORKLOADS, (VS, "warm_read_us"), ("floor", "warm_read_us"), lambda value: value <= 1.3)),
    Bar("batch of 256 (get_batch) ≥ 2× faster per record than single reads, tokens and small",
        _ratio_bar(["tokens", "small"], (VS, "warm_read_us"), (VS, "batch_read_us"), lambda value: value >= 2)),
    Bar("batch of 256 of blobs ≤ 1.3× the floor's batch per record",
        _ratio_bar(["blobs"], (VS, "batch_read_us"), ("floor", "batch_read_us"), lambda value: value <= 1.3)),
    Bar("get_batch_flat faster than get_batch",
        _ratio_bar(FLAT_WORKLOADS, (VS, "batch_read_us"), (VS, "batch_read_us@flat"), lambda value: value > 1)),
    Bar("get_batch_flat faster than get_batch + concatenation (what collation needs)",
        _ratio_bar(FLAT_WORKLOADS, (VS, "batch_read_us@concat"), (VS, "batch_read_us@flat"), lambda value: value > 1)),
    Bar("cold random reads ≤ 0.7× the floor's time",
        _ratio_bar(WORKLOADS, (VS, "cold_read_us"), ("floor", "cold_read_us"), lambda value: value <= 0.7)),
    Bar("cold: ≤ 8 KB read from disk per small record", _value_bar("small", VS, "cold_read_kb", "KB", lambda value: value <= 8)),
    Bar("open < 1 ms (1× and 100× records)",
        _sizes_bar("open_ms", lambda small, large: f"{small:.3f} ms at 1×, {large:.3f} ms at 100×",
                   lambda small, large: max(small, large) < 1)),
    Bar("open at 100× records ≤ 2× open at 1×",
        _sizes_bar("open_ms", lambda small, large: f"{large / small:.2f}×", lambda small, large: large <= 2 * small)),
    Bar("private memory (RssAnon) growth on open independent of the record count (< 1 MB apart)",
        _sizes_bar("rss_anon_open_mb", lambda small, large: f"{small:.2f} MB at 1×, {large:.2f} MB at 100×",
                   lambda small, large: abs(large - small) < 1)),
    Bar("total RSS growth on open (mapped file pages included) at 100× ≤ 4 MB",
        _sizes_bar("rss_open_mb", lambda small, large: f"{small:.2f} MB at 1×, {large:.2f} MB at 100×",
                   lambda small, large: large <= 4)),
    Bar("2 DataLoader workers cost < 1.3× the PSS of one process",
        _ratio_bar(["tokens"], (VS, "loader_pss_mb@2w"), (VS, "loader_pss_mb@0w"), lambda value: value < 1.3)),
    Bar("append per record ≥ 0.8× a plain f.write loop",
        _ratio_bar(FLAT_WORKLOADS, (VS, "write_mb_s@append"), ("floor", "write_mb_s"), lambda value: value >= 0.8)),
    Bar("extend ≥ 0.8× a plain f.write loop",
        _ratio_bar(FLAT_WORKLOADS, (VS, "write_mb_s"), ("floor", "write_mb_s"), lambda value: value >= 0.8)),
    Bar("extend_flat vectorised: faster than the plain f.write loop",
        _ratio_bar(FLAT_WORKLOADS, (VS, "write_mb_s@extend_flat"), ("floor", "write_mb_s"), lambda value: value > 1)),
    Bar("verify ≥ 1 GB/s on blobs", _value_bar("blobs", VS, "verify_mb_s", "MB/s", lambda value: value >= 1000)),
    Bar("verify ≥ 1 GB/s on small records", _value_bar("small", VS, "verify_mb_s", "MB/s", lambda value: value >= 1000)),
    Bar("sequential scan of small records ≥ 5× the floor's one-record loop (varstore: iteration)",
        _ratio_bar(["small"], (VS, "scan_mb_s"), ("floor", "scan_mb_s"), lambda value: value >= 5)),
    Bar("sequential scan of small records ≥ 5× the floor's one-record loop (varstore: iter_flat chunks)",
        _ratio_bar(["small"], (VS, "scan_mb_s@flat"), ("floor", "scan_mb_s"), lambda value: value >= 5)),
]


def bars(results: dict[str, Any]) -> str:
    lines = ["| bar | measured | result |", "|---|---|---|"]
    for bar in BARS:
        measured = bar.measure(results)
        figure, verdict = ("not measured", "–") if measured is None else (measured[0], "pass" if measured[1] else "**miss**")
        lines.append(f"| {bar.text} | {figure} | {verdict} |")
    return "\n".join(lines)


def notes(results: dict[str, Any]) -> str:
    """Machine, load, command, and every skipped peer, unsupported workload and error, with its reason."""
    meta = results["meta"]
    lines = [
        f"Machine: {meta['cpu']}, {meta['cores']} cores, {meta['memory_gib']} GiB, Linux {meta['kernel']}, "
        f"Python {meta['python']}, read-ahead {meta['read_ahead']}.",
        f"Load average (1/5/15 min) before: {meta['load_before']}, after: {meta['load_after']}; "
        f"the run took {meta['minutes']:.1f} min at scale {meta['scale']:g}.",
        f"Command: `{meta['command']}`.",
        "Versions: " + ", ".join(f"{name} {version}" for name, version in meta["versions"].items()) + ".",
    ]
    for name, result in results["peers"].items():
        if result.get("skipped"):
            lines.append(f"Skipped {LABELS[name]}: {result['skipped']}.")
        for error in result.get("errors", []):
            lines.append(f"{LABELS[name]} error: {error}.")
        for workload, figures in result.get("figures", {}).items():
            for kind in ("unsupported", "error"):
                if kind in figures:
                    lines.append(f"{LABELS[name]}, {workload}: {kind}: {figures[kind]}.")
            if figures.get("cold_left_after_evict_kb", 0) > 64:
                lines.append(f"{LABELS[name]}, {workload}: {figures['cold_left_after_evict_kb']:.0f} KB stayed in the page "
                             "cache after eviction; its cold figures are partly warm.")
            if figures.get("reads_back") is False:
                lines.append(f"{LABELS[name]}, {workload}: records read back differ from those written.")
    return "\n".join(f"- {line}" for line in lines)


CHART_PANELS = [
    ("warm random single read, µs/record", "warm_read_us", WORKLOADS),
    ("random batch of 256, µs/record", "batch_read_us", WORKLOADS),
    ("cold random read, µs/record", "cold_read_us", WORKLOADS),
    ("sequential scan, MB/s", "scan_mb_s", WORKLOADS),
    ("write, MB/s", "write_mb_s", WORKLOADS),
    ("open, ms (small records: small-1x has 1/100 of them)", "open_ms", ("small-1x", "small")),
]


def chart(results: dict[str, Any], path: Path) -> None:
    """One panel per figure, grouped by workload, one bar per peer, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in PEER_MODULES if results["peers"].get(name, {}).get("figures")]
    figure, axes = plt.subplots(2, 3, figsize=(18, 9.5))
    width = 0.8 / max(1, len(names))
    colours = plt.get_cmap("tab10")
    for axis, (title, key, groups) in zip(axes.flat, CHART_PANELS):
        for position, name in enumerate(names):
            values = [_figure(results, name, group, key) for group in groups]
            axis.bar([index + position * width for index in range(len(groups))], [value or 0 for value in values],
                     width, label=LABELS[name], color=colours(list(PEER_MODULES).index(name)))
        axis.set_title(title)
        axis.set_yscale("log")
        axis.set_xticks([index + width * (len(names) - 1) / 2 for index in range(len(groups))], groups)
        axis.grid(axis="y", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(names))
    meta = results["meta"]
    figure.suptitle(f"varstore and its peers: {meta['cpu']}, {meta['cores']} cores, scale {meta['scale']:g} (lower is better for "
                    "µs and ms, higher for MB/s)")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(results: dict[str, Any], destinations: list[Path]) -> str:
    """Write results.json, results.md and chart.png to each destination; returns the markdown."""
    markdown = "\n\n".join([table(results), bars(results), notes(results)]) + "\n"
    for destination in destinations:
        destination.mkdir(parents=True, exist_ok=True)
        (destination / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (destination / "results.md").write_text(markdown)
        chart(results, destination / "chart.png")
    return markdown
