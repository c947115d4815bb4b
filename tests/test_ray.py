"""varstore.ray on a local Ray (2 CPUs, started once for this file): datasets written by Ray Data equal the serial
`ShardedWriter`'s, locally and on the loopback S3 server, exactly once under a failed task attempt, with no
manifest after a failed conversion; and the pipeline JSON Lines -> BPE tokenizer -> token shards, token for token."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install -e '.[ray]'")
pytest.importorskip("ray.data")

import varstore  # noqa: E402
from varstore.errors import ShardExistsError  # noqa: E402
from varstore.format.manifest import MANIFEST_NAME  # noqa: E402
from varstore.ray import VarstoreDatasink, read_varstore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# Ray's node start-up has fixed waits that a busy machine can outlast: the raylet must register with the GCS
# within 30 s (hard-coded in ray/_private/node.py: "The current node timed out during startup") and the GCS must
# write its port within RAY_gcs_server_port_wait_time_s (30 s by default). The latter is raised here; the former is
# retried, a fresh node each time, and only if every attempt times out are the Ray tests skipped, saying why.
RAY_START_ATTEMPTS = 4
GCS_PORT_WAIT_S = "120"
# Worker processes must register with the raylet within worker_register_timeout_seconds (60 s by default): a
# safety net against a worker that never starts, not an expectation of how fast one imports ray.
RAY_SYSTEM_CONFIG = {"worker_register_timeout_seconds": 600}
# Every test here, the first one's share of the fixture's retries included, is stopped after this long.
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),  # Ray reading its own deprecated options
    pytest.mark.timeout(RAY_START_ATTEMPTS * 150 + 300),
]


def is_start_up_timeout(error: BaseException) -> bool:
    """Whether `ray.init` failed because a start-up wait ran out (the node, the GCS port), not for another reason."""
    return isinstance(error, TimeoutError) or "timed out" in str(error).lower()


def start_ray() -> None:
    """`ray.init` for these tests, retried (after `ray.shutdown`) when a start-up wait runs out; skips the tests,
    with the last error, when no attempt starts the node."""
    failures: list[str] = []
    before = os.environ.get("RAY_gcs_server_port_wait_time_s")
    os.environ["RAY_gcs_server_port_wait_time_s"] = GCS_PORT_WAIT_S  # read by ray.init and the processes it starts
    try:
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            try:
                ray.init(
                    num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                    runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, _system_config=RAY_SYSTEM_CONFIG,
                )
                return
            except Exception as error:
                ray.shutdown()  # the processes this attempt started
                if not is_start_up_timeout(error):
                    raise
                failures.append(f"attempt {attempt}: {type(error).__name__}: {str(error).splitlines()[0]}")
    finally:
        if before is None:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)
        else:
            os.environ["RAY_gcs_server_port_wait_time_s"] = before
    pytest.skip(f"a local Ray node did not start in {RAY_START_ATTEMPTS} attempts (a start-up wait of Ray's ran out "
                "each time; is the machine overloaded?): " + "; ".join(failures))


@pytest.fixture(scope="session")
def ray_session(s3_server: Any) -> Iterator[Any]:
    """Ray with 2 CPUs for the whole session, started after the S3 server so its workers inherit the session's
    AWS environment (loopback endpoint, dummy keys); progress bars off."""
    start_ray()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        yield s3_server
    finally:
        ray.shutdown()


@contextlib.contextmanager
def preserving_order() -> Iterator[None]:
    """Ray Data hands blocks on in the dataset's order while this lasts (else in the order tasks end)."""
    options = ray.data.DataContext.get_current().execution_options
    before, options.preserve_order = options.preserve_order, True
    try:
        yield
    finally:
        options.preserve_order = before


@pytest.fixture
def ordered(ray_session: Any) -> Iterator[None]:
    """Ray Data hands blocks to write tasks in the dataset's order (for the tests that compare order)."""
    with preserving_order():
        yield


def serial_records(directory: Path, records: list[Any], **options: Any) -> list[Any]:
    """What the serial writer stores for `records`, read back."""
    with varstore.ShardedWriter(directory, **options) as writer:
        writer.extend(records)
    return list(varstore.open(directory))


def stored_records(path: str | Path, **options: Any) -> list[Any]:
    """Every record of the dataset at `path`, after verifying it."""
    dataset = varstore.open(path, **options)
    dataset.verify()
    return list(dataset)


def files_besides_the_dataset(directory: Path) -> set[str]:
    """Files in `directory` other than the manifest and the files of the shards it lists."""
    listed = {MANIFEST_NAME} if (directory / MANIFEST_NAME).exists() else set()
    if listed:
        for entry in json.loads((directory / MANIFEST_NAME).read_text())["shards"]:
            listed |= {entry["name"] + ".data", entry["name"] + ".index"}
    return set(os.listdir(directory)) - listed


def blobs(count: int) -> list[bytes]:
    rng = np.random.default_rng(7)
    return [rng.bytes(int(size)) for size in rng.integers(0, 300, count)]


def test_import_varstore_never_imports_ray() -> None:
    code = "import sys, varstore, varstore.dataset.parts; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pandas')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_ray_dataset_written_in_order_equals_the_serial_writer_locally(ordered: None, tmp_path: Path) -> None:
    records = blobs(600)
    ds = ray.data.from_items([{"data": record} for record in records], override_num_blocks=6)
    ds.write_datasink(VarstoreDatasink(tmp_path / "ray", codec="bytes", column="data", max_shard_bytes=20_000))
    assert stored_records(tmp_path / "ray") == serial_records(tmp_path / "serial", records) == records
    names = [entry["name"] for entry in json.loads((tmp_path / "ray" / MANIFEST_NAME).read_text())["shards"]]
    assert len({name.split("-")[2] for name in names}) > 1, names  # written by several tasks
    assert files_besides_the_dataset(tmp_path / "ray") == set()
    assert [row["record"] for row in read_varstore(tmp_path / "ray").take_all()] == records


def test_ray_token_lists_written_to_s3_equal_the_serial_writer_as_a_multiset(ray_session: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 50_000, int(length), dtype=np.int32) for length in rng.integers(0, 200, 500)]
    url = f"s3://{ray_session.new_bucket()}/tokens"
    ds = ray.data.from_items([{"tokens": document.tolist()} for document in documents], override_num_blocks=4)
    sink = VarstoreDatasink(url, codec="ndarray", dtype="int32", column="tokens", max_shard_bytes=50_000,
                            storage_options=ray_session.storage_options)
    ds.write_datasink(sink)
    written = stored_records(url, storage_options=ray_session.storage_options)
    serial = serial_records(tmp_path / "serial", documents, codec="ndarray", dtype="int32")
    assert Counter(record.tobytes() for record in written) == Counter(record.tobytes() for record in serial)
    with preserving_order():  # without it, blocks come in the order their read tasks end: any order on a busy machine
        read_back = read_varstore(url, column="tokens", storage_options=ray_session.storage_options).take_all()
    assert [np.asarray(row["tokens"], np.int32).tobytes() for row in read_back] == [record.tobytes() for record in written]


@pytest.mark.parametrize("failure", ["raises", "worker dies"])
def test_a_task_failing_its_first_attempt_gives_every_record_once_and_leaves_no_shard_files(
    ordered: None, tmp_path: Path, failure: str
) -> None:
    records = [f"record {i}".encode() for i in range(200)]
    marker = tmp_path / "failed-once"

    def record_failing_in_first_attempt(row: dict[str, Any]) -> bytes:
        if row["data"] == b"record 150" and not marker.exists():
            marker.touch()  # the first attempt has published shards of records 100..149 by now
            if failure == "raises":
                raise RuntimeError("planted failure of a first attempt")
            os._exit(1)
        return row["data"]

    ds = ray.data.from_items([{"data": record} for record in records], override_num_blocks=2)
    sink = VarstoreDatasink(tmp_path / "out", record=record_failing_in_first_attempt, max_shard_bytes=1000, max_shard_records=10)
    ds.write_datasink(sink, ray_remote_args={"max_retries": 2, "retry_exceptions": True})
    assert marker.exists()
    assert stored_records(tmp_path / "out") == records
    assert files_besides_the_dataset(tmp_path / "out") == set()
    attempts: dict[str, set[str]] = {}
    for entry in json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["shards"]:
        attempts.setdefault(entry["name"].split("-")[2], set()).add(entry["name"].split("-")[3])
    assert sorted(attempts.values()) == [{"0"}, {"1"}], attempts  # the failed part is listed from its retry only


def test_a_failing_conversion_leaves_no_manifest_and_no_shards(ray_session: Any, tmp_path: Path) -> None:
    def failing_record(row: dict[str, Any]) -> bytes:
        if row["id"] == 99:
            raise RuntimeError("planted conversion error")
        return str(row["id"]).encode()

    with pytest.raises(Exception, match="planted conversion error"):
        ray.data.range(100, override_num_blocks=2).write_datasink(
            VarstoreDatasink(tmp_path / "out", record=failing_record, max_shard_bytes=100, max_shard_records=5)
        )
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
    assert [name for name in os.listdir(tmp_path / "out") if name.startswith("part-")] == []


def test_rerun_with_overwrite_gives_the_same_dataset_and_without_it_is_refused(ordered: None, tmp_path: Path) -> None:
    ds = ray.data.range(300, override_num_blocks=3)

    def as_text(row: dict[str, Any]) -> str:
        return f"row {row['id']}"

    ds.write_datasink(VarstoreDatasink(tmp_path / "out", codec="str", record=as_text, max_shard_records=40))
    first = stored_records(tmp_path / "out")
    with pytest.raises(ShardExistsError):
        ds.write_datasink(VarstoreDatasink(tmp_path / "out", codec="str", record=as_text))
    assert stored_records(tmp_path / "out") == first
    ds.write_datasink(VarstoreDatasink(tmp_path / "out", codec="str", record=as_text, max_shard_records=40, overwrite=True))
    assert stored_records(tmp_path / "out") == first == [f"row {i}" for i in range(300)]
    assert files_besides_the_dataset(tmp_path / "out") == set()


def test_json_lines_tokenized_on_ray_equal_the_serial_path_token_for_token(ordered: None, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = np.random.default_rng(11)
    words = ["data", "shard", "record", "token", "memory", "mapped", "index", "offset", "varstore", "ray", "über", "日本"]
    texts = [" ".join(rng.choice(words, int(n))) + f" #{i}" for i, n in enumerate(rng.integers(1, 60, 2000))]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"], show_progress=False))
    serialized = tokenizer.to_str()

    def tokenize(batch: Any) -> Any:
        import pyarrow as pa
        from tokenizers import Tokenizer

        encodings = Tokenizer.from_str(serialized).encode_batch(batch.column("text").to_pylist())
        return pa.table({"tokens": pa.array([encoding.ids for encoding in encodings], pa.list_(pa.int32()))})

    lines = ray.data.read_json(str(tmp_path / "corpus.jsonl"), lines=True, override_num_blocks=4)
    tokens = lines.map_batches(tokenize, batch_format="pyarrow", batch_size=256)
    tokens.write_datasink(VarstoreDatasink(tmp_path / "ray", codec="ndarray", dtype="int32", column="tokens", max_shard_bytes=40_000))

    with open(tmp_path / "corpus.jsonl", encoding="utf-8") as lines_file:
        documents = [np.asarray(tokenizer.encode(json.loads(line)["text"]).ids, np.int32) for line in lines_file]
    serial = serial_records(tmp_path / "serial", documents, codec="ndarray", dtype="int32")
    written = stored_records(tmp_path / "ray")
    assert len(written) == len(serial) == 2000
    assert all(np.array_equal(ray_document, serial_document) for ray_document, serial_document in zip(written, serial))
    assert sum(len(document) for document in written) > 2000
