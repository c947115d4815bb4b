"""Spark: `write_dataframe` turns a DataFrame into one varstore dataset, each partition's task writing its own shards.

    from varstore.spark import write_dataframe
    write_dataframe(df, "s3://bucket/corpus", column="text", codec="str")

Each task writes its partition with a `varstore.dataset.parts.PartWriter` (part = the partition's index, attempt =
Spark's task attempt id, unique in the application: a retried task, even in a retried stage, writes under
new names) and returns its shards' manifest entries as one JSON string. The driver collects those results
— a Spark job's result holds exactly one successful attempt per partition — and commits them in partition
order with `varstore.dataset.parts.commit_parts`, which writes the manifest last and removes whatever other
attempts wrote. A failed job commits nothing and removes every shard of its run (`abandon_run`).

Records cross from Spark to varstore as pandas values (`mapInPandas`): a ``binary`` column gives `bytes`,
``string`` gives `str`, an array column gives numpy arrays. Only plain options, the user's `record`
function and JSON strings travel between driver and executors; no varstore object is pickled. Executors
need varstore installed, which the first write of an application checks with a one-task job (`_check_workers`);
a URL destination must be reachable from every executor.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Sequence

try:
    import pandas as pd
    from pyspark import TaskContext
    from pyspark.sql import DataFrame
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(f"varstore.engines.spark needs pyspark, pandas and pyarrow: pip install 'varstore[spark]' ({error})") from None

from ..dataset.parts import PartWriter, abandon_run, commit_parts, new_run_id, refuse_existing_dataset
from ..errors import FormatError, ShardExistsError, VarstoreError
from ..format.codecs import make_codec
from ..format.compression import check_compression
from ..local.file_url import resolve_file_url
from ..remote.filesystems import is_url

__all__ = ["write_dataframe"]

# The local properties SparkContext.setJobGroup sets; restored after the job.
_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
# How long the driver waits for a job's remaining tasks (killed, or speculative copies) to end before it
# commits or abandons the run; a task still running after that may leave part-RUN-* files no manifest lists.
_TASK_END_TIMEOUT = 60.0
_NO_JOB = SimpleNamespace(stageIds=())

# One row per task: which partition, which attempt, and its shards' manifest entries as a JSON list.
_RESULT_SCHEMA = "part int, attempt long, entries string"
# (application id, workers' Python) pairs whose workers were seen to import varstore (`_check_workers`).
_WORKERS_CHECKED: set[tuple[str, str]] = set()
# The last import error in a failed job's message: its Python worker's traceback ends with it.
_IMPORT_ERROR = re.compile(r"^\s*((?:ModuleNotFound|Import)Error: .*)$", re.MULTILINE)


def write_dataframe(
    df: DataFrame,
    path_or_url: str | os.PathLike[str],
    *,
    column: str | None = None,
    record: Callable[[dict[str, Any]], Any] | None = None,
    codec: str = "bytes",
    dtype: Any = None,
    shape: Sequence[int] | None = None,
    checksums: bool = True,
    max_shard_bytes: int = 256 << 20,
    max_shard_records: int | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    metadata: dict[str, Any] | None = None,
    compression: str | None = None,
    compression_level: int = 3,
) -> list[str]:
    """Write the rows of `df`, in partition order, as the dataset at `path_or_url`; returns its shard names.

    Each row gives one record: the value of `column`, or `record(row)` with the row as a dict of its
    columns. `codec`, `dtype`, `shape`, `checksums`, `max_shard_bytes`, `max_shard_records`, `compression` and
    `compression_level` are `ShardedWriter`'s (shard limits apply per partition; each shard chooses or trains its
    compression on its own first records). An existing dataset is refused before any task
    runs unless `overwrite`. If the job fails, no manifest is written and the run's shards are removed.
    """
    if (column is None) == (record is None):
        raise VarstoreError("give exactly one of column= (a column of records) and record= (a function of a row)")
    destination = resolve_file_url(path_or_url)
    destination = destination if is_url(destination) else os.path.abspath(destination)
    if column is not None and column not in df.columns:
        raise VarstoreError(f"the DataFrame has no column {column!r} (it has {df.columns})", path=destination)
    make_codec(codec, dtype=dtype, shape=shape)  # bad codec or compression options fail here, not in every task
    check_compression(compression, compression_level)
    if not overwrite:
        refuse_existing_dataset(destination, storage_options)
    _check_workers(df)
    run_id = new_run_id()
    write_partition = functools.partial(
        _write_partition,
        destination=destination,
        writer_options={
            "run_id": run_id, "codec": codec, "dtype": dtype, "shape": shape,
            "checksums": checksums, "max_shard_bytes": max_shard_bytes, "max_shard_records": max_shard_records,
            "storage_options": storage_options, "compression": compression, "compression_level": compression_level,
        },
        column=column,
        record=record,
    )
    try:
        parts = _entries_in_part_order(_run_job(df.mapInPandas(write_partition, schema=_RESULT_SCHEMA), run_id, destination))
    except BaseException:
        abandon_run(destination, run_id, storage_options=storage_options)
        raise
    try:
        return commit_parts(
            destination, parts, run_id=run_id, codec=codec, dtype=dtype, shape=shape, metadata=metadata,
            overwrite=overwrite, storage_options=storage_options,
        )
    except (ShardExistsError, FormatError):  # refused before its manifest: nothing of this run is listed
        abandon_run(destination, run_id, storage_options=storage_options)
        raise


def _check_workers(df: DataFrame) -> None:
    """Refuse, saying what to set, if Spark's Python workers cannot import varstore (the Python of a venv run without
    activating it: the workers then start the system ``python3``); checked once per application and worker Python,
    with a one-task job, instead of failing every task with a Java stack trace."""
    context = _context_of(df)
    if context is None:  # Spark Connect: its workers are the server's to configure
        return
    checked = (context.applicationId, context.pythonExec)
    if checked in _WORKERS_CHECKED:
        return
    try:
        context.parallelize([None], 1).mapPartitions(_importing_varstore()).collect()
    except Exception as error:
        failures = _IMPORT_ERROR.findall(str(error))
        if not failures:
            raise
        raise VarstoreError(
            f"Spark's Python workers run {context.pythonExec}, which cannot import varstore ({failures[-1]}); set "
            f"PYSPARK_PYTHON, or spark.pyspark.python, to a Python that has varstore installed (the driver's is "
            f"{sys.executable}) before the SparkSession starts"
        ) from None
    _WORKERS_CHECKED.add(checked)


def _importing_varstore() -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task that imports what `_write_partition` needs and yields nothing. Defined inside a function, so Spark's
    cloudpickle sends it by value: a module-level function would be imported by name, from varstore itself."""

    def task(rows: Iterator[Any]) -> Iterator[Any]:
        import varstore.engines.spark  # noqa: F401, PLW0406 - on the worker, where it is not imported yet

        return iter(())

    return task


def _run_job(results: DataFrame, run_id: str, destination: str) -> list[Any]:
    """Collect the tasks' result rows, in a job group of this run's own; return (or raise) only once no task of
    the job is still running, so that the commit or `abandon_run` that follows sees every file they write.
    (A failed job's other tasks are killed asynchronously and a successful job's speculative copies too.)"""
    context = _context_of(results)
    if context is None:  # Spark Connect: nothing to wait on from here
        return results.collect()
    previous = {key: context.getLocalProperty(key) for key in _JOB_GROUP_PROPERTIES}
    group = f"varstore-{run_id}"
    context.setJobGroup(group, f"varstore.engines.spark.write_dataframe to {destination}")
    try:
        return results.collect()
    finally:
        for key, value in previous.items():
            context.setLocalProperty(key, value)  # type: ignore[arg-type]  # None removes it
        _wait_for_tasks_to_end(context, group)


def _context_of(frame: DataFrame) -> Any:
    """The SparkContext of `frame`'s session, or None under Spark Connect, which has none."""
    try:
        return frame.sparkSession.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect raises its own error (PySparkNotImplementedError, or older ones)
        return None


def _wait_for_tasks_to_end(context: Any, group: str, timeout: float = _TASK_END_TIMEOUT) -> None:
    """Poll Spark's status tracker until the stages of `group`'s jobs have no running task (at most `timeout` s)."""
    tracker = context.statusTracker()
    stages = {stage for job in tracker.getJobIdsForGroup(group) for stage in (tracker.getJobInfo(job) or _NO_JOB).stageIds}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(info.numActiveTasks for info in map(tracker.getStageInfo, stages) if info is not None):
            return
        time.sleep(0.05)


def _write_partition(
    batches: Iterator[pd.DataFrame],
    *,
    destination: str,
    writer_options: dict[str, Any],
    column: str | None,
    record: Callable[[dict[str, Any]], Any] | None,
) -> Iterator[pd.DataFrame]:
    """The task: write this partition's records as this attempt's shards, yield one row of their entries."""
    context = TaskContext.get()
    part, attempt = context.partitionId(), context.taskAttemptId()
    writer = PartWriter(destination, part=part, attempt=attempt, **writer_options)
    try:
        for batch in batches:
            if column is not None:
                writer.extend(batch[column].tolist())
            else:
                writer.extend(record(row) for row in batch.to_dict("records"))  # type: ignore[misc]
        entries = writer.close()
    except BaseException:
        writer.abort()
        raise
    yield pd.DataFrame({"part": [part], "attempt": [attempt], "entries": [json.dumps(entries)]})


def _entries_in_part_order(rows: list[Any]) -> list[list[dict[str, Any]]]:
    """``parts[k]``: the entries of partition k's one successful attempt (none for a partition without a row)."""
    by_part: dict[int, Any] = {}
    for row in rows:
        if row.part in by_part:  # Spark keeps one result per partition; two would list one partition twice
            raise VarstoreError(f"partition {row.part} was reported by attempts {by_part[row.part].attempt} and {row.attempt}")
        by_part[row.part] = row
    parts: list[list[dict[str, Any]]] = [[] for _ in range(max(by_part, default=-1) + 1)]
    for part, row in by_part.items():
        parts[part] = json.loads(row.entries)
    return parts
