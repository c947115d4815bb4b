"""Conversion throughput: JSON Lines of text documents into record shards, by varstore's serial writer, its
parallel `convert`, Ray, Spark, litdata and MosaicML Streaming (MDS), on the same input (issue 13).

    python3 tools/bench/convert.py [--megabytes 100] [--cores 2] [--repeats 3] [--out bench-out/convert] [--peers a,b]

The input is one JSON Lines file of ~`--megabytes` MB of documents ``{"id": N, "text": "..."}``, 100 to 900
bytes of printable ASCII each. Every peer reads that file, parses each line and writes the document texts
as records (shards of ~`SHARD_BYTES`), in its own fresh process and in the virtual environment that has it
(``.venv``: varstore, Ray, Spark; ``.venv-bench``: litdata, MosaicML Streaming):

- ``serial``: `varstore.ShardedWriter`, ``json.loads`` per line, ``append`` per text (one process);
- ``convert-1`` / ``convert-2``: `varstore.conversion.convert(field="text", workers=1 or 2)`, what
  ``varstore convert --field text --workers N`` runs (worker processes started inside the timing);
- ``ray``: ``ray.data.read_json`` into `varstore.ray.VarstoreDatasink`, ``ray.init(num_cpus=--cores)``;
- ``spark``: ``spark.read.json`` (schema given, one partition per core) into `varstore.spark.write_dataframe`,
  ``local[--cores]``;
- ``litdata``: ``optimize(num_workers=--cores)`` over byte ranges of the file cut at line ends;
- ``mds``: ``MDSWriter`` (serial; it has no parallel writer of its own, only ``dataframe_to_mds`` on Spark).

A conversion is timed from opening the input to the committed output; start-up (imports, ``ray.init``, the
Spark session) is timed apart. Each peer converts ``--repeats`` times in one process after its start-up (the
first run of Ray and Spark also starts their Python workers); the table gives the first, best and median
runs, because other jobs on a shared machine make single runs noisy. Each output is read back and checked
against the input: record count, bytes and the sum of the records' CRC32s.

The ``append`` step sets the serial append path beside the raw floor's build (tools/bench/peers/floor.py:
payloads and offsets written with plain ``f.write``) on the harness's "small", "tokens", "blobs" and
"structured" workloads: `Writer.extend` (what run.py's build measures) and an ``append`` loop, best of
`APPEND_REPEATS` alternating runs each, as throughput ratios to the floor.

Writes ``results.json`` and ``results.md`` to ``--out`` and prints the table. This parent process uses the
standard library only; run it with any Python 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[2]
VENVS = {"dev": ROOT / ".venv", "bench": ROOT / ".venv-bench"}
# peer: (which virtual environment runs it, label in the table)
PEERS = {
    "serial": ("dev", "varstore ShardedWriter (serial)"),
    "convert-1": ("dev", "varstore convert --workers 1"),
    "convert-2": ("dev", "varstore convert --workers 2"),
    "ray": ("dev", "Ray Data + VarstoreDatasink"),
    "spark": ("dev", "Spark + write_dataframe"),
    "litdata": ("bench", "litdata optimize"),
    "mds": ("bench", "MDS MDSWriter (serial)"),
}
SHARD_BYTES = 64 << 20
LITDATA_INPUTS_PER_WORKER = 4
APPEND_WORKLOADS = ("small", "tokens", "blobs", "structured")
APPEND_REPEATS = 5
STEP_TIMEOUT_S = 600
SEED = 13


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=100, help="input size (JSON Lines text, MB)")
    parser.add_argument("--cores", type=int, default=2, help="workers / CPUs given to the parallel peers")
    parser.add_argument("--repeats", type=int, default=3, help="conversions per peer after its start-up")
    parser.add_argument("--append-scale", type=float, default=1.0, help="scale of the append-vs-floor workloads")
    parser.add_argument("--out", default=str(ROOT / "bench-out" / "convert"), help="output directory")
    parser.add_argument("--peers", help=f"comma-separated subset of {','.join([*PEERS, 'append'])}")
    return parser.parse_args()


# The children: one step each, in the virtual environment that has the peer.


def _fingerprint(records: Iterable[Any]) -> dict[str, int]:
    """Count, bytes and CRC32 sum of records (str as UTF-8): equal in any order iff the same records, each once
    (up to a collision)."""
    count = total = crc_sum = 0
    for record in records:
        payload = record.encode("utf-8") if isinstance(record, str) else record
        count += 1
        total += len(payload)
        crc_sum += zlib.crc32(payload)
    return {"records": count, "bytes": total, "crc_sum": crc_sum}


def make_input(path: str, megabytes: int) -> dict[str, Any]:
    """One JSON Lines file of documents of 100-900 printable ASCII bytes (no quote or backslash, so each text is
    its own JSON string); returns the texts' fingerprint and the file's size."""
    import numpy as np

    generator = np.random.default_rng(SEED)
    count = megabytes * 1_000_000 // 500
    lengths = generator.integers(100, 901, size=count)
    characters = generator.integers(32, 127, size=int(lengths.sum()), dtype=np.uint8)
    characters[(characters == ord('"')) | (characters == ord("\\"))] = ord(" ")
    blob = characters.tobytes()
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    texts = [blob[start:end] for start, end in zip(bounds, bounds[1:])]
    with open(path, "wb") as stream:
        stream.writelines(b'{"id": %d, "text": "%s"}\n' % (number, text) for number, text in enumerate(texts))
    return {**_fingerprint(texts), "file_bytes": os.path.getsize(path)}


def _texts(path: str, first: int = 0, stop: int | None = None) -> Iterator[str]:
    """The "text" of each line starting in bytes [first, stop) of the JSON Lines file (`first` at a line start)."""
    with open(path, "rb") as stream:
        stream.seek(first)
        position = first
        for line in stream:
            if stop is not None and position >= stop:
                return
            position += len(line)
            yield json.loads(line)["text"]


def _line_ranges(path: str, count: int) -> list[tuple[int, int]]:
    """`count` byte ranges of the file, each starting at a line start."""
    size = os.path.getsize(path)
    starts = [0]
    with open(path, "rb") as stream:
        for k in range(1, count):
            stream.seek(max(size * k // count - 1, starts[-1]))
            stream.readline()
            starts.append(min(stream.tell(), size))
    return [(start, stop) for start, stop in zip(starts, [*starts[1:], size]) if start < stop]


def _varstore_records(path: str) -> Iterator[Any]:
    import varstore

    return iter(varstore.open(path))


def _timed(convert: Callable[[], Any], read_back: Callable[[], Iterable[Any]], expected: dict[str, int]) -> dict[str, Any]:
    started = time.perf_counter()
    convert()
    seconds = time.perf_counter() - started
    found = _fingerprint(read_back())
    return {"seconds": seconds, "check": "ok" if found == expected else f"mismatch: found {found}, expected {expected}",
            "load": os.getloadavg()[0]}


def _runs(task: dict[str, Any], start: Callable[[], Callable[[], None]], convert: Callable[[str], None],
          read_back: Callable[[str], Iterable[Any]] = _varstore_records) -> dict[str, Any]:
    """Start the peer (imports, engine session: timed apart), then convert `repeats` times into fresh directories,
    each output checked then deleted; stop the peer."""
    started = time.perf_counter()
    stop = start()
    result: dict[str, Any] = {"startup_s": time.perf_counter() - started, "runs": []}
    try:
        for run in range(task["repeats"]):
            directory = os.path.join(task["data"], f"{task['peer']}-{run}")
            result["runs"].append(_timed(lambda: convert(directory), lambda: read_back(directory), task["expected"]))
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        stop()
    return result


def _nothing_to_stop() -> None:
    """A library without a session."""


def _serial(task: dict[str, Any]) -> dict[str, Any]:
    def start() -> Callable[[], None]:
        import varstore  # noqa: F401

        return _nothing_to_stop

    def convert(directory: str) -> None:
        import varstore

        with varstore.ShardedWriter(directory, codec="str", max_shard_bytes=SHARD_BYTES) as writer:
            append = writer.append
            for text in _texts(task["input"]):
                append(text)

    return _runs(task, start, convert)


def _convert(workers: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(task: dict[str, Any]) -> dict[str, Any]:
        def start() -> Callable[[], None]:
            import varstore.conversion

            return _nothing_to_stop

        def convert(directory: str) -> None:
            from varstore.conversion import convert

            convert(task["input"], directory, workers=workers, field="text", max_shard_bytes=SHARD_BYTES)

        return _runs(task, start, convert)

    return run


def _ray(task: dict[str, Any]) -> dict[str, Any]:
    def start() -> Callable[[], None]:
        import ray

        import varstore.ray

        ray.init(num_cpus=task["cores"], include_dashboard=False, log_to_driver=False, configure_logging=False)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        return ray.shutdown

    def convert(directory: str) -> None:
        import ray

        from varstore.ray import VarstoreDatasink

        documents = ray.data.read_json(task["input"], lines=True, override_num_blocks=task["cores"])
        documents.write_datasink(VarstoreDatasink(directory, codec="str", column="text", max_shard_bytes=SHARD_BYTES))

    return _runs(task, start, convert)


def _spark(task: dict[str, Any]) -> dict[str, Any]:
    session: list[Any] = []

    def start() -> Callable[[], None]:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        import varstore.spark

        partition_bytes = os.path.getsize(task["input"]) // task["cores"] + 1  # one partition per core
        spark = (
            SparkSession.builder.master(f"local[{task['cores']}]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.files.maxPartitionBytes", str(partition_bytes))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        session.append(spark)
        return spark.stop

    def convert(directory: str) -> None:
        from varstore.spark import write_dataframe

        frame = session[0].read.schema("id long, text string").json(task["input"])
        write_dataframe(frame, directory, column="text", codec="str", max_shard_bytes=SHARD_BYTES)

    return _runs(task, start, convert)


def _litdata(task: dict[str, Any]) -> dict[str, Any]:
    def start() -> Callable[[], None]:
        import litdata  # noqa: F401

        return _nothing_to_stop

    def convert(directory: str) -> None:
        import functools

        import litdata

        ranges = _line_ranges(task["input"], task["cores"] * LITDATA_INPUTS_PER_WORKER)
        litdata.optimize(
            fn=functools.partial(_litdata_texts, task["input"]), inputs=ranges, output_dir=directory,
            chunk_bytes=SHARD_BYTES, num_workers=task["cores"], start_method="fork", mode="overwrite", verbose=False,
        )

    def read_back(directory: str) -> Iterable[str]:
        import litdata

        return litdata.StreamingDataset(directory)

    return _runs(task, start, convert, read_back)


def _litdata_texts(path: str, byte_range: tuple[int, int]) -> Iterator[str]:
    yield from _texts(path, *byte_range)


def _mds(task: dict[str, Any]) -> dict[str, Any]:
    def start() -> Callable[[], None]:
        from bench.peers.mds import streaming  # noqa: F401  (streaming with its torchvision stand-in)

        return _nothing_to_stop

    def convert(directory: str) -> None:
        from bench.peers.mds import streaming

        with streaming.MDSWriter(out=directory, columns={"text": "str"}, size_limit=SHARD_BYTES) as writer:
            write = writer.write
            for text in _texts(task["input"]):
                write({"text": text})

    def read_back(directory: str) -> Iterator[str]:
        from bench.peers.mds import streaming

        dataset = streaming.StreamingDataset(local=directory, batch_size=256, shuffle=False)
        return (sample["text"] for sample in dataset)

    return _runs(task, start, convert, read_back)


def _timed_write(write: Callable[[str], None], directory: str) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    os.sync()  # no earlier write's dirty pages left to throttle this one's fsync
    started = time.perf_counter()
    write(directory)
    seconds = time.perf_counter() - started
    shutil.rmtree(directory, ignore_errors=True)
    return seconds


def _append(task: dict[str, Any]) -> dict[str, Any]:
    """Floor build, `Writer.extend` and an `append` loop per workload, alternating, best of APPEND_REPEATS."""
    import varstore
    from bench.peers.floor import PEER as floor
    from bench.peers.varstore_shard import _CODECS, SHARD_NAME
    from bench.peers.varstore_shard import PEER as varstore_peer
    from bench.workloads import cached_records, workloads

    def append_loop(workload: Any, records: list[Any], directory: str) -> None:
        with varstore.Writer(os.path.join(directory, SHARD_NAME), **_CODECS[workload.kind]) as writer:
            append = writer.append
            for record in records:
                append(record)

    writers = {"floor": floor.write, "extend": varstore_peer.write, "append": append_loop}
    figures = {}
    for workload in workloads(task["append_scale"]):
        if workload.name not in APPEND_WORKLOADS:
            continue
        records = cached_records(workload)
        directory = os.path.join(task["data"], "append", workload.name)
        seconds: dict[str, list[float]] = {name: [] for name in writers}
        for _ in range(APPEND_REPEATS):
            for name, write in writers.items():
                seconds[name].append(_timed_write(lambda target: write(workload, records, target), directory))
        figures[workload.name] = {"records": workload.count, "payload_bytes": workload.payload_bytes,
                                  "seconds": {name: min(values) for name, values in seconds.items()},
                                  "all_seconds": seconds}
        cached_records.cache_clear()
    return {"workloads": figures, "load": os.getloadavg()[0]}


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "input": lambda task: make_input(task["input"], task["megabytes"]),
    "serial": _serial,
    "convert-1": _convert(1),
    "convert-2": _convert(2),
    "ray": _ray,
    "spark": _spark,
    "litdata": _litdata,
    "mds": _mds,
    "append": _append,
}


def child_main(task_json: str) -> None:
    task = json.loads(task_json)
    started = time.perf_counter()
    try:
        result = {"python": sys.executable, **STEPS[task["peer"]](task)}
    except Exception as error:
        traceback.print_exc()
        lines = [line for line in str(error).splitlines() if line.strip()]
        result = {"error": f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]}
    result["process_s"] = time.perf_counter() - started
    Path(task["result"]).write_text(json.dumps(result, indent=1))


# The parent: one child per step, the table.


def run_step(peer: str, venv: str, task: dict[str, Any], out: Path) -> dict[str, Any]:
    python = VENVS[venv] / "bin" / "python"
    if not python.exists():
        return {"error": f"{python} does not exist (tools/bench/run.py sets up .venv-bench)"}
    result_path = out / "logs" / f"{peer}.json"
    result_path.unlink(missing_ok=True)
    task = {**task, "peer": peer, "result": str(result_path)}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools"), "PYTHONWARNINGS": "ignore", "RAY_DEDUP_LOGS": "0"}
    started = time.perf_counter()
    with open(out / "logs" / f"{peer}.log", "w") as log:
        try:
            code = subprocess.run([str(python), "-c", "import sys; from bench.convert import child_main; child_main(sys.argv[1])",
                                   json.dumps(task)], env=env, stdout=log, stderr=subprocess.STDOUT, timeout=STEP_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {STEP_TIMEOUT_S} s; see logs/{peer}.log"}
    print(f"  {peer} ({venv} venv): {time.perf_counter() - started:.1f} s", flush=True)
    if not result_path.exists():
        return {"error": f"exited with code {code} and no result; see logs/{peer}.log"}
    return json.loads(result_path.read_text())


def conversion_table(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    expected = meta["input"]
    serial_runs = results["peers"].get("serial", {}).get("runs")
    serial = min(run["seconds"] for run in serial_runs) if serial_runs else None
    lines = [
        f"Conversion of one JSON Lines file ({expected['file_bytes'] / 1e6:.1f} MB; {expected['records']:,} documents, "
        f"{expected['bytes'] / 1e6:.1f} MB of text, 100-900 bytes each) into text records, shards of ~{SHARD_BYTES >> 20} MiB; "
        f"{meta['cores']} workers/CPUs for the parallel peers, {meta['cpus']} CPUs on the machine. Each peer converts "
        f"{meta['repeats']} times after its start-up; MB/s and records/s are the records' text over the best run "
        "(reading and parsing the input included, start-up not); × serial compares best runs.",
        "",
        "| peer | venv | start-up (s) | first run (s) | best (s) | median (s) | MB/s | records/s | × serial | load | check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    notes = []
    for peer, result in results["peers"].items():
        if peer == "append":
            continue
        venv, label = PEERS[peer]
        if "error" in result:
            lines.append(f"| {label} | {venv} |{' – |' * 8} failed |")
            notes.append(f"- {label}: {result['error']}")
            continue
        seconds = [run["seconds"] for run in result["runs"]]
        best = min(seconds)
        checks = [run["check"] for run in result["runs"]]
        notes += [f"- {label}, run {number + 1}: {check}" for number, check in enumerate(checks) if check != "ok"]
        check = "ok" if all(check == "ok" for check in checks) else "MISMATCH"
        lines.append(
            f"| {label} | {venv} | {result['startup_s']:.1f} | {seconds[0]:.2f} | {best:.2f} | {statistics.median(seconds):.2f} "
            f"| {expected['bytes'] / best / 1e6:.1f} | {expected['records'] / best:,.0f} "
            f"| {'–' if serial is None else f'{serial / best:.2f}'} | {max(run['load'] for run in result['runs']):.1f} | {check} |")
    return lines + ([""] + notes if notes else [])


def append_table(result: dict[str, Any]) -> list[str]:
    if "error" in result:
        return [f"Append path vs raw floor: failed: {result['error']}"]
    lines = [
        f"Serial append path vs the raw floor's build (one shard, fsync'd; best of {APPEND_REPEATS} alternating runs; "
        "ratio = varstore throughput / floor throughput, one core):",
        "",
        "| workload | records | MB | floor build (s) | Writer.extend (s) | extend / floor | append loop (s) | append / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, figures in result["workloads"].items():
        seconds = figures["seconds"]
        lines.append(
            f"| {name} | {figures['records']:,} | {figures['payload_bytes'] / 1e6:.1f} | {seconds['floor']:.2f} "
            f"| {seconds['extend']:.2f} | {seconds['floor'] / seconds['extend']:.2f}× "
            f"| {seconds['append']:.2f} | {seconds['floor'] / seconds['append']:.2f}× |")
    return lines


def table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = conversion_table(results)
    if "append" in results["peers"]:
        lines += ["", *append_table(results["peers"]["append"])]
    lines += ["", f"Load average before / after: {meta['load_before']} / {meta['load_after']}; {meta['minutes']:.1f} min; "
              f"`{meta['command']}`."]
    return "\n".join(lines) + "\n"


def _load_average() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def main() -> int:
    arguments = _arguments()
    peers = arguments.peers.split(",") if arguments.peers else [*PEERS, "append"]
    unknown = sorted(set(peers) - {*PEERS, "append"})
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; choose from {','.join([*PEERS, 'append'])}")
    out = Path(arguments.out).resolve()
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    (out / "logs").mkdir(exist_ok=True)
    started, load_before = time.time(), _load_average()
    task: dict[str, Any] = {"input": str(data / "documents.jsonl"), "data": str(data), "megabytes": arguments.megabytes,
                            "cores": arguments.cores, "repeats": arguments.repeats, "append_scale": arguments.append_scale}
    print("input:", flush=True)
    made = run_step("input", "dev", task, out)
    if "error" in made:
        raise SystemExit(f"cannot make the input: {made['error']}")
    task["expected"] = {name: made[name] for name in ("records", "bytes", "crc_sum")}
    results: dict[str, Any] = {"peers": {}}
    for peer in peers:
        print(f"{peer}:", flush=True)
        results["peers"][peer] = run_step(peer, PEERS[peer][0] if peer in PEERS else "dev", task, out)
    shutil.rmtree(data, ignore_errors=True)
    results["meta"] = {
        "command": " ".join(["python3", "tools/bench/convert.py", *sys.argv[1:]]),
        "input": {name: made[name] for name in ("records", "bytes", "crc_sum", "file_bytes")},
        "cores": arguments.cores, "repeats": arguments.repeats, "shard_bytes": SHARD_BYTES, "cpus": os.cpu_count(),
        "venvs": {name: str(path) for name, path in VENVS.items()},
        "load_before": load_before, "load_after": _load_average(), "minutes": (time.time() - started) / 60,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
