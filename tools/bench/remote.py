"""Remote datasets: varstore, MosaicML Streaming and litdata reading the same records from one S3 bucket.

    python3 tools/bench/remote.py [--scale S] [--out DIR] [--peers a,b] [--workers N] [--latency-ms MS]

Sets up ``.venv-bench`` if needed and re-runs itself there. moto's S3 server runs on 127.0.0.1 behind the
tests' fault proxy (tests/helpers_fault_proxy.py), which delays every request by ``--latency-ms`` (20 by
default) and counts requests and response body bytes. Nothing leaves the machine.

Each peer writes the "blobs" workload (4,000 records of ~9 KB at scale 1) as its own shards of about
`SHARD_BYTES`, in its own process; the files are uploaded as they are under ``s3://BUCKET/<peer>/``
straight to moto (not timed, not counted). Then each peer is measured in a fresh process with an empty
cache directory, reading through the proxy:

- ``map``: one epoch of a DataLoader with a shuffling `RandomSampler` (batch 64, ``--workers`` workers)
  over the peer's map-style dataset (varstore's `RecordDataset` reads a batch through ``__getitems__``;
  MDS and litdata read sample by sample with ``dataset[i]``);
- ``stream``: one epoch of the peer's streaming dataset in its own shuffled order, batch 64;
- ``stream-ordered``: the same in stored order (``shuffle=False``).

Two peers are also measured in a second configuration, because their default one fails here for a reason
found and explained in their adapters: MDS with workers from a fork server (forked workers share the
main process's S3 connection: peers/mds_forkserver_remote.py) and litdata with obstore off (its obstore
client refuses http:// endpoints: peers/litdata_boto3_remote.py).

Each epoch is checked: sample count, bytes and the sum of the samples' CRC32s must equal the records'.
Requests and bytes are all the process sent and received, opening the dataset included. Writes
``results.json`` and ``results.md`` to DIR (default ``bench-out/remote``) and prints the table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import environment  # noqa: E402

ROOT = environment.ROOT
REMOTE_PEERS = {"varstore": "varstore_remote", "mds": "mds_remote", "mds-forkserver": "mds_forkserver_remote",
                "litdata": "litdata_remote", "litdata-boto3": "litdata_boto3_remote"}
LABELS = {"varstore": "varstore", "mds": "MosaicML Streaming (MDS)", "mds-forkserver": "MDS (fork-server workers)",
          "litdata": "litdata", "litdata-boto3": "litdata (boto3, obstore off)"}
WORKLOAD = "blobs"
RECORDS = 4000
MIN_RECORDS = 200
SHARD_BYTES = 8 << 20
BATCH = 64
SEED = 0
BUCKET = "varstore-bench"
KEY = SECRET = "testing"
# mode -> how the table names its epoch
MODES = {"map": "shuffled map-style", "stream": "streaming, shuffled", "stream-ordered": "streaming, in order"}
EPOCH_BUDGET_S = 60.0
STEP_TIMEOUT_S = 300
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help=f"records = {RECORDS} x S")
    parser.add_argument("--out", default=str(ROOT / "bench-out" / "remote"), help="output directory")
    parser.add_argument("--peers", help=f"comma-separated subset of {','.join(REMOTE_PEERS)}")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="delay added to every request")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one step of one peer, as JSON (internal)
    return parser.parse_args()


def _workload(scale: float) -> Any:
    from bench.workloads import Workload

    return Workload(WORKLOAD, max(MIN_RECORDS, round(RECORDS * scale)), "bytes")


# The child: one step of one peer in a fresh process.


def _load_peer(name: str) -> Any:
    return importlib.import_module(f"bench.peers.{REMOTE_PEERS[name]}").PEER


def _buffer(sample: Any) -> Any:
    """A sample's bytes as a buffer: bytes as they are, a uint8 tensor through numpy."""
    return sample.numpy() if hasattr(sample, "numpy") else sample


def _fingerprint(records: Iterable[Any]) -> dict[str, int]:
    """Count, bytes and the sum of CRC32s of records in any order: equal sums mean the same records read
    back whole (up to a collision), each once."""
    count = total = crc_sum = 0
    for record in records:
        buffer = _buffer(record)
        count += 1
        total += memoryview(buffer).nbytes
        crc_sum += zlib.crc32(buffer)
    return {"samples": count, "bytes": total, "crc_sum": crc_sum}


def _epoch(open_batches: Any, expected: dict[str, int]) -> dict[str, Any]:
    """Open a peer's loader, then read one epoch of batches (stopping after `EPOCH_BUDGET_S`)."""
    started = time.perf_counter()
    batches = open_batches()
    opened = time.perf_counter()
    seen = {"samples": 0, "bytes": 0, "crc_sum": 0}
    first_batch_s = None
    stopped = False
    for batch in batches:
        for name, value in _fingerprint(batch).items():
            seen[name] += value
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - opened
        if time.perf_counter() - opened > EPOCH_BUDGET_S:
            stopped = True
            break
    epoch_s = time.perf_counter() - opened
    if stopped:
        check = f"partial: {seen['samples']:,} of {expected['samples']:,} samples in {EPOCH_BUDGET_S:g} s"
    else:
        check = "ok" if seen == expected else f"mismatch: read {seen}, expected {expected}"
    return {
        "open_s": opened - started, "first_batch_s": first_batch_s, "epoch_s": epoch_s,
        "samples": seen["samples"], "samples_s": seen["samples"] / epoch_s, "check": check,
    }


def _map_loader(peer: Any, remote: Any, workers: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from bench.peers.base_remote import keep_list

    dataset = peer.map_dataset(remote)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=keep_list,
                      multiprocessing_context=peer.worker_start if workers else None)


def run_child(task: dict[str, Any]) -> dict[str, Any]:
    from bench.peers.base_remote import Remote
    from bench.workloads import cached_records

    peer = _load_peer(task["peer"])
    workload = _workload(task["scale"])
    if task["step"] == "write":
        started = time.perf_counter()
        peer.write(workload, task["directory"], SHARD_BYTES)
        return {"write_s": time.perf_counter() - started}
    remote = Remote(task["url"], task["endpoint_url"], KEY, SECRET, task["cache_dir"])
    expected = _fingerprint(cached_records(workload))
    if task["step"] == "map":
        return _epoch(lambda: _map_loader(peer, remote, task["workers"]), expected)
    shuffle = task["step"] == "stream"
    return _epoch(lambda: peer.stream(remote, BATCH, task["workers"], SEED, shuffle), expected)


def _describe(error: Exception) -> str:
    """The error's type, the first line of its message, the next line that names an error and the last line (a
    DataLoader worker's error wraps the worker's; litdata's obstore errors end with a debug dump)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = [line for line in lines[1:] if "rror" in line][:1]
    text = " … ".join(dict.fromkeys(lines[:1] + cause + lines[-1:]))
    return f"{type(error).__name__}: {text}"[:500]


def child_main(task_json: str) -> None:
    task = json.loads(task_json)
    try:
        result = run_child(task)
    except Exception as error:
        traceback.print_exc()
        result = {"error": _describe(error)}
    Path(task["result"]).write_text(json.dumps(result, indent=1))


# The parent: the server, the uploads, one child per step, the table.


def _aws_environment(endpoint_url: str, no_files: Path) -> dict[str, str]:
    """Dummy keys and an endpoint on loopback; profiles, instance metadata and proxies out of reach."""
    environment_ = {name: value for name, value in os.environ.items()
                    if not name.startswith("AWS_") and name not in PROXY_VARIABLES}
    return {
        **environment_,
        "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint_url, "S3_ENDPOINT_URL": endpoint_url, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ALLOW_HTTP": "true",  # obstore (litdata's streaming reads) refuses http:// endpoints without it
        "AWS_CONFIG_FILE": str(no_files / "config"), "AWS_SHARED_CREDENTIALS_FILE": str(no_files / "credentials"),
    }


class Steps:
    """Runs one step of one peer in a fresh interpreter, logging to `logs/`, and returns its JSON result."""

    def __init__(self, out: Path, scale: float, workers: int) -> None:
        self.out, self.scale, self.workers = out, scale, workers
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, task: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        result_path = self.logs / f"{name}.json"
        result_path.unlink(missing_ok=True)
        task = {**task, "scale": self.scale, "workers": self.workers, "result": str(result_path)}
        command = [sys.executable, "-m", "bench.remote", "--child", json.dumps(task)]
        env = {**env, "PYTHONPATH": str(ROOT / "tools"), "PYTHONWARNINGS": "ignore"}
        started = time.perf_counter()
        with open(self.logs / f"{name}.log", "w") as log:
            try:
                code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=STEP_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {STEP_TIMEOUT_S} s; see logs/{name}.log"}
        print(f"  {name}: {time.perf_counter() - started:.1f} s", flush=True)
        if not result_path.exists():
            return {"error": f"exited with code {code} and no result; see logs/{name}.log"}
        return json.loads(result_path.read_text())


def _upload(client: Any, directory: Path, prefix: str) -> dict[str, int]:
    """Every file under `directory` to s3://BUCKET/prefix/<relative path>; returns objects and bytes."""
    objects = stored = 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(directory).as_posix()}")
        objects, stored = objects + 1, stored + path.stat().st_size
    return {"objects": objects, "stored_bytes": stored}


def _traffic(proxy: Any, samples: int, log: Path) -> dict[str, Any]:
    """Requests and response body bytes the proxy saw since its counters were cleared, total and per sample;
    the requests themselves go to `log` (JSON lines: method, path, range, status, body bytes)."""
    requests = proxy.requests()
    with open(log, "w") as stream:
        for request in requests:
            stream.write(json.dumps([request.method, request.path, request.range, request.status,
                                     request.body_bytes]) + "\n")
    gets = sum(1 for request in requests if request.method == "GET")
    received = sum(request.body_bytes for request in requests)
    per = max(samples, 1)
    return {"requests": len(requests), "get_requests": gets, "bytes_received": received,
            "requests_per_sample": len(requests) / per, "gets_per_sample": gets / per,
            "bytes_per_sample": received / per}


def _cpu_seconds() -> tuple[float, float]:
    """CPU time of this process (moto and the proxy, which serve every request) and of its finished children
    (a peer's process and its DataLoader workers)."""
    server, client = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return server.ru_utime + server.ru_stime, client.ru_utime + client.ru_stime


def measure_peer(peer: str, steps: Steps, proxy: Any, client: Any, env: dict[str, str], data: Path) -> dict[str, Any]:
    directory = data / peer
    result: dict[str, Any] = {"modes": {}}
    written = steps(f"{peer}-write", {"step": "write", "peer": peer, "directory": str(directory)}, env)
    if "error" in written:
        result["error"] = f"write: {written['error']}"
        return result
    result.update(written, **_upload(client, directory, peer))
    for mode in MODES:
        cache_dir = data / f"cache-{peer}-{mode}-{os.getpid()}"
        shutil.rmtree(cache_dir, ignore_errors=True)
        proxy.clear_counters()
        task = {"step": mode, "peer": peer, "url": f"s3://{BUCKET}/{peer}", "endpoint_url": proxy.url,
                "cache_dir": str(cache_dir)}
        server_before, client_before = _cpu_seconds()
        figures = steps(f"{peer}-{mode}", task, env)
        server_after, client_after = _cpu_seconds()
        figures.update(server_cpu_s=server_after - server_before, client_cpu_s=client_after - client_before)
        figures.update(_traffic(proxy, figures.get("samples", 0), steps.logs / f"{peer}-{mode}-requests.jsonl"))
        result["modes"][mode] = figures
        shutil.rmtree(cache_dir, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    return result


def _load_average() -> str:
    with open("/proc/loadavg") as stream:
        return " ".join(stream.read().split()[:3])


def _cell(figures: dict[str, Any], name: str, format_: str) -> str:
    value = figures.get(name)
    return "–" if value is None else format(value, format_)


def table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Remote datasets: {meta['records']:,} records of the \"{WORKLOAD}\" workload "
        f"({meta['payload_bytes'] / 1e6:.1f} MB), shards of ~{SHARD_BYTES >> 20} MiB, moto S3 on 127.0.0.1 "
        f"behind a proxy adding {meta['latency_ms']:g} ms per request; DataLoader batch {BATCH}, "
        f"{meta['workers']} workers; empty cache per epoch.",
        "",
        "| peer | epoch | samples/s | epoch (s) | first batch (s) | open (s) | requests/sample | GETs/sample "
        "| KB/sample | read / stored | server CPU (s) | check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    notes = []
    for peer, result in results["peers"].items():
        label = LABELS[peer]
        if "error" in result:
            lines.append(f"| {label} | – |{' – |' * 9} failed |")
            notes.append(f"- {label}: {result['error']}")
            continue
        for mode, figures in result["modes"].items():
            epoch = MODES[mode]
            if "error" in figures:
                lines.append(f"| {label} | {epoch} |{' – |' * 9} failed |")
                notes.append(f"- {label}, {epoch}: {figures['error']}")
                continue
            check = figures["check"].partition(":")[0]
            # Bytes over the dataset's stored size, for a whole epoch only.
            amplification = f"{figures['bytes_received'] / result['stored_bytes']:.2f}" if check == "ok" else "–"
            if check != "ok":
                notes.append(f"- {label}, {epoch}: {figures['check']}")
            lines.append(
                f"| {label} | {epoch} | {_cell(figures, 'samples_s', ',.0f')} | {_cell(figures, 'epoch_s', '.2f')} "
                f"| {_cell(figures, 'first_batch_s', '.2f')} | {_cell(figures, 'open_s', '.2f')} "
                f"| {_cell(figures, 'requests_per_sample', '.3f')} | {_cell(figures, 'gets_per_sample', '.3f')} "
                f"| {figures['bytes_per_sample'] / 1024:.1f} | {amplification} "
                f"| {_cell(figures, 'server_cpu_s', '.1f')} | {check} |")
    lines += ["", f"Load average before / after: {meta['load_before']} / {meta['load_after']}; "
              f"{meta['minutes']:.1f} min; `{meta['command']}`."]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main() -> int:
    arguments = _arguments()
    if arguments.child:
        child_main(arguments.child)
        return 0
    environment.run_in_bench_venv(__file__)
    sys.path.insert(0, str(ROOT))  # tests/helpers_fault_proxy.py
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from tests.helpers_fault_proxy import FaultProxy

    peers = arguments.peers.split(",") if arguments.peers else list(REMOTE_PEERS)
    out = Path(arguments.out).resolve()
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)
    (data / "no-aws-files").mkdir(parents=True)
    steps = Steps(out, arguments.scale, arguments.workers)
    workload = _workload(arguments.scale)
    started, load_before = time.time(), _load_average()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        moto_url = f"http://{host}:{port}"
        os.environ.clear()
        os.environ.update(_aws_environment(moto_url, data / "no-aws-files"))
        client = boto3.client("s3", endpoint_url=moto_url)
        client.create_bucket(Bucket=BUCKET)
        with FaultProxy(moto_url) as proxy:
            proxy.delay(arguments.latency_ms / 1000, times=None)
            env = _aws_environment(proxy.url, data / "no-aws-files")
            results: dict[str, Any] = {"peers": {}}
            for peer in peers:
                print(f"{peer}:", flush=True)
                results["peers"][peer] = measure_peer(peer, steps, proxy, client, env, data)
    finally:
        server.stop()
    shutil.rmtree(data, ignore_errors=True)
    results["meta"] = {
        "command": " ".join(["python3", "tools/bench/remote.py", *sys.argv[1:]]),
        "records": workload.count, "payload_bytes": workload.payload_bytes, "shard_bytes": SHARD_BYTES,
        "batch": BATCH, "workers": arguments.workers, "latency_ms": arguments.latency_ms,
        "load_before": load_before, "load_after": _load_average(), "minutes": (time.time() - started) / 60,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
