"""`varstore.spark.write_dataframe` on Spark in local mode: equal to the serial `ShardedWriter`, to a local
directory and to the loopback S3 server; exactly once when a task attempt fails or its worker dies; nothing
committed by a failed job; overwrite re-runs. One SparkSession (``local[2,2]``: two cores, two attempts per
task) for the whole test session."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra: pip install -e '.[spark]'")

import varstore  # noqa: E402
from varstore.errors import ShardExistsError  # noqa: E402
from varstore.remote.filesystems import open_filesystem  # noqa: E402
from varstore.spark import write_dataframe  # noqa: E402

# 600 records of 0 to 3000 bytes (some empty) over 3 partitions; shards of at most 40 kB, so several per part.
RECORD_COUNT = 600
PARTITIONS = 3
SHARD_BYTES = 40_000
SCHEMA = "id long, payload binary"


def make_payloads() -> list[bytes]:
    generator = random.Random(13)
    return [generator.randbytes(generator.choice([0, 1, 7, 100, 700, 3000])) for _ in range(RECORD_COUNT)]


PAYLOADS = make_payloads()


# No limit here is an expectation of speed. Starting the JVM has no time limit (pyspark waits for the gateway's
# port file or for the JVM to exit); a JVM that exits at start is retried, and only when no attempt starts one are
# the Spark tests skipped, saying why. The JVM's start and the first job (its Python daemon and workers) fall in the
# first test, so on a busy machine a test takes minutes: every test here is stopped only after 15 minutes.
SPARK_START_ATTEMPTS = 3
pytestmark = pytest.mark.timeout(900)


def start_spark(builder: Any) -> Any:
    """`builder.getOrCreate()`, retried when the JVM exits before its gateway is up; skips the tests if it never is."""
    from pyspark.errors import PySparkRuntimeError

    failures: list[str] = []
    for attempt in range(1, SPARK_START_ATTEMPTS + 1):
        try:
            return builder.getOrCreate()
        except PySparkRuntimeError as error:
            condition = getattr(error, "getCondition", getattr(error, "getErrorClass", lambda: None))()
            if condition != "JAVA_GATEWAY_EXITED":
                raise
            failures.append(f"attempt {attempt}: {str(error).splitlines()[0]}")
    pytest.skip(f"Spark's JVM did not start in {SPARK_START_ATTEMPTS} attempts (is Java 17+ installed, and is there "
                "memory for a 1 GB driver?): " + "; ".join(failures))


@pytest.fixture(scope="session")
def spark(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's SparkSession. Started after the S3 server, so the Python workers inherit its loopback-only
    AWS environment; workers run this interpreter, with a node cache of their own (as on another node: the
    driver's cleanup cannot reach their staging directories); no UI; few shuffle partitions."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # for the daemon module
    session = start_spark(
        SparkSession.builder.master("local[2,2]")  # local[N,F]: F attempts per task (spark.task.maxFailures is ignored in local mode)
        .appName("varstore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.coalescePartitions.enabled", "false")  # else a small sort lands in one partition
        .config("spark.driver.memory", "1g")
        .config("spark.python.daemon.module", "tests.helpers_spark_daemon")
        # The Python side must connect back to the JVM's result and authentication sockets within this (15 s by
        # default): a safety net, not an expectation of how fast a loaded machine schedules a process.
        .config("spark.python.authenticate.socketTimeout", "600s")
        .config("spark.executorEnv.VARSTORE_CACHE_DIR", str(tmp_path_factory.mktemp("executor-node-cache")))
    )
    session.sparkContext.setLogLevel("FATAL")  # failed attempts are planned here; their stack traces are noise
    yield session
    session.stop()


def test_import_varstore_never_imports_spark_or_pandas() -> None:
    code = "import sys, varstore; assert not {'pyspark', 'pandas', 'py4j'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)


def payload_frame(spark: Any, payloads: list[bytes] = PAYLOADS) -> Any:
    """A DataFrame of (id, payload) rows in id order, cut into PARTITIONS contiguous partitions."""
    rows = spark.sparkContext.parallelize(list(enumerate(payloads)), PARTITIONS)
    return spark.createDataFrame(rows, SCHEMA)


def serial_records(directory: Path, payloads: list[bytes]) -> list[bytes]:
    """What the serial writer stores for `payloads`."""
    with varstore.ShardedWriter(directory, max_shard_bytes=SHARD_BYTES) as writer:
        writer.extend(payloads)
    return list(varstore.open(directory))


def read_verified(path: Any, **options: Any) -> list[Any]:
    reader = varstore.open(path, **options)
    reader.verify()
    return list(reader)


def listed_files(names: list[str]) -> set[str]:
    return {"manifest.json"} | {name + suffix for name in names for suffix in (".data", ".index")}


def local_files(directory: Path) -> set[str]:
    """Every file in `directory` but lock files (a writer's lock is unlinked at release, see varstore.local.locks)."""
    return {name for name in os.listdir(directory) if not name.endswith(".lock")}


def bucket_files(url: str, options: dict[str, Any]) -> set[str]:
    fs, root = open_filesystem(url, options)
    fs.invalidate_cache()
    try:
        return {os.path.basename(path) for path in fs.ls(root, detail=False)} if fs.exists(root) else set()
    finally:
        fs.invalidate_cache()


def test_ordered_dataframe_is_written_in_partition_order_equal_to_the_serial_writer(spark: Any, tmp_path: Path) -> None:
    shuffled = list(enumerate(PAYLOADS))
    random.Random(5).shuffle(shuffled)
    ordered = spark.createDataFrame(shuffled, SCHEMA).orderBy("id")  # a range shuffle into several partitions

    names = write_dataframe(ordered, tmp_path / "spark", column="payload", max_shard_bytes=SHARD_BYTES)

    assert read_verified(tmp_path / "spark") == serial_records(tmp_path / "serial", PAYLOADS) == PAYLOADS
    assert len({name.split("-")[2] for name in names}) > 1, "one task wrote everything: nothing ran in parallel"
    assert local_files(tmp_path / "spark") == listed_files(names)


def test_record_function_and_empty_partitions_give_the_serial_writer_records(spark: Any, tmp_path: Path) -> None:
    texts = [f"row {number} " * (number % 5) for number in range(40)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(list(enumerate(texts)), 8), "id long, text string")
    frame = frame.filter("id < 10 or id >= 30")  # partitions 2 to 5 are left empty

    write_dataframe(frame, tmp_path / "spark", record=lambda row: f"{row['id']}:{row['text']}", codec="str")

    kept = [f"{number}:{text}" for number, text in enumerate(texts) if number < 10 or number >= 30]
    assert read_verified(tmp_path / "spark") == kept


def test_s3_destination_equals_the_serial_writer_and_keeps_only_listed_objects(
    spark: Any, s3_server: Any, tmp_path: Path
) -> None:
    url = f"s3://{s3_server.new_bucket()}/corpus"
    options = s3_server.storage_options

    names = write_dataframe(
        payload_frame(spark), url, column="payload", max_shard_bytes=SHARD_BYTES, storage_options=options,
        metadata={"source": "test"},
    )

    assert read_verified(url, storage_options=options) == serial_records(tmp_path / "serial", PAYLOADS)
    assert varstore.open(url, storage_options=options).metadata == {"source": "test"}
    assert bucket_files(url, options) == listed_files(names)


class PlantedFailure(RuntimeError):
    """Raised on purpose inside a task."""


def fail_first_attempt(marker: Path, *, kill: bool) -> Any:
    """A record function that, in the first attempt of partition 1 and after half its rows (so shards are
    already published), raises or kills its Python worker, leaving `marker` as evidence it did."""
    from pyspark import TaskContext

    def record(row: dict[str, Any]) -> bytes:
        context = TaskContext.get()
        if context.partitionId() == 1 and context.attemptNumber() == 0 and row["id"] >= RECORD_COUNT // 2:
            published = [name for name in os.listdir(marker.parent / "spark") if name.endswith(".index")]
            marker.write_text(str(len(published)))  # the shards this attempt published before failing
            if kill:
                os._exit(17)  # no abort, no cleanup: commit_parts must remove what this attempt published
            raise PlantedFailure("first attempt of partition 1")
        return row["payload"]

    return record


@pytest.mark.parametrize("kill", [False, True], ids=["raises", "worker-dies"])
def test_a_failed_first_attempt_is_retried_and_every_record_is_stored_once(spark: Any, tmp_path: Path, kill: bool) -> None:
    marker = tmp_path / "failed-once"
    (tmp_path / "spark").mkdir()

    # Batches of 50 rows: extend buffers up to 1,024 records of a generator, so the failing attempt publishes its
    # first shard at the end of its second batch, before row RECORD_COUNT // 2, whatever the other tasks do.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        names = write_dataframe(
            payload_frame(spark), tmp_path / "spark", record=fail_first_attempt(marker, kill=kill), max_shard_bytes=SHARD_BYTES
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert marker.exists(), "the planted failure never ran"
    assert int(marker.read_text()) > 0, "the failed attempt had published no shard: its cleanup is untested"
    assert read_verified(tmp_path / "spark") == PAYLOADS
    assert local_files(tmp_path / "spark") == listed_files(names), "a failed attempt's shards were left or listed"


def test_collected_rows_come_only_from_successful_attempts(spark: Any) -> None:
    """The claim write_dataframe rests on: a task's rows reach collect() only if that attempt succeeded, even
    rows it yielded before failing."""
    from pyspark import TaskContext

    def yield_then_fail(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        context = TaskContext.get()
        for _ in batches:
            pass
        yield pd.DataFrame({"part": [context.partitionId()], "attempt": [context.attemptNumber()]})
        if context.partitionId() == 1 and context.attemptNumber() == 0:
            raise PlantedFailure("after yielding a row")

    rows = spark.range(30, numPartitions=PARTITIONS).mapInPandas(yield_then_fail, "part int, attempt int").collect()

    assert sorted((row.part, row.attempt) for row in rows) == [(0, 0), (1, 1), (2, 0)]


def test_a_failed_job_commits_nothing_and_keeps_the_previous_dataset(spark: Any, tmp_path: Path) -> None:
    destination = tmp_path / "spark"
    previous = write_dataframe(payload_frame(spark, PAYLOADS[:50]), destination, column="payload")

    def always_fail(row: dict[str, Any]) -> bytes:
        if row["id"] >= RECORD_COUNT // 2:
            raise PlantedFailure("every attempt")
        return row["payload"]

    from pyspark.errors import PythonException

    with pytest.raises(PythonException, match="every attempt"):
        write_dataframe(payload_frame(spark), destination, record=always_fail, max_shard_bytes=SHARD_BYTES, overwrite=True)

    assert read_verified(destination) == PAYLOADS[:50]
    assert local_files(destination) == listed_files(previous), "the failed run left shards behind"



# How long a task waits for another task's step before failing the test: a safety net against a hang, never an
# expectation of how fast tasks run (they run in parallel, local[2,2], however slowly).
TASK_WAIT_SAFETY_NET_S = 600.0


def wait_for(condition: Any, seconds: float) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_failed_job_is_abandoned_only_after_its_other_tasks_end(spark: Any, s3_server: Any) -> None:
    """Partition 1 fails (both attempts) while partition 0 is writing to S3; partition 0, once partition 1's last
    attempt is failing (so the job fails), waits until its uploaded shards disappear (or 10 s pass) and writes on,
    uploading more. Abandoning the run as soon as the job fails would leave those; the driver must wait for
    partition 0's task to end. (A local destination does not show it: abandoning removes a late task's staging
    directory, so it fails and cleans up itself; nor does a shared node cache, for the same reason: the fixture
    gives the executors their own.) The 10 s start when the job fails, not when partition 0 published, so a busy
    machine's slow retry of partition 1 does not use them up."""
    from pyspark import TaskContext
    from pyspark.errors import PythonException

    url = f"s3://{s3_server.new_bucket()}/corpus"
    options = s3_server.storage_options
    published_marker = f"{url}-markers/partition-0-published"
    failing_marker = f"{url}-markers/partition-1-last-attempt-failing"

    def exists(fs: Any, path: str) -> bool:
        fs.invalidate_cache()
        return fs.exists(path)

    def record(row: dict[str, Any]) -> bytes:
        context = TaskContext.get()
        fs, _ = open_filesystem(url, options)
        if context.partitionId() == 1:
            if not wait_for(lambda: exists(fs, published_marker), TASK_WAIT_SAFETY_NET_S):
                raise PlantedFailure(f"partition 0 uploaded no shard within {TASK_WAIT_SAFETY_NET_S:g} s")
            if context.attemptNumber() == 1:  # local[2,2]: the last attempt
                fs.pipe_file(failing_marker, b"failing")
            raise PlantedFailure("partition 1 fails in every attempt")
        if context.partitionId() == 0 and row["id"] == 150:
            published = [name for name in bucket_files(url, options) if name.endswith(".index")]
            assert published, "partition 0 had uploaded no shard after 150 records"
            fs.pipe_file(published_marker, b"published")
            if not wait_for(lambda: exists(fs, failing_marker), TASK_WAIT_SAFETY_NET_S):
                raise PlantedFailure(f"partition 1's last attempt did not run within {TASK_WAIT_SAFETY_NET_S:g} s")
            wait_for(lambda: not set(published) <= bucket_files(url, options), 10.0)  # abandoned under it?
        return row["payload"]

    # Batches of 50 rows, as in the test above: partition 0 has published shards of its own by row 150 whatever
    # the batch size Spark would choose (extend buffers up to 1,024 records of a generator).
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        with pytest.raises(PythonException, match="every attempt"):
            write_dataframe(payload_frame(spark), url, record=record, max_shard_bytes=SHARD_BYTES, storage_options=options)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert bucket_files(url, options) == set(), "a task that outlived the failed job left shards behind"


def test_overwrite_rerun_gives_the_same_dataset_and_removes_the_replaced_shards(spark: Any, tmp_path: Path) -> None:
    destination = tmp_path / "spark"
    first = write_dataframe(payload_frame(spark), destination, column="payload", max_shard_bytes=SHARD_BYTES)

    with pytest.raises(ShardExistsError):
        write_dataframe(payload_frame(spark), destination, column="payload")
    second = write_dataframe(payload_frame(spark), destination, column="payload", max_shard_bytes=SHARD_BYTES, overwrite=True)

    assert read_verified(destination) == PAYLOADS
    assert not set(first) & set(second), "a re-run reused shard names"
    assert local_files(destination) == listed_files(second)
