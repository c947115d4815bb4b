"""The long crash campaign behind tests/test_crash.py: many random datasets, each written by a child that
is SIGKILLed before every one of its file-changing OS calls in turn, at random moments while appending,
and again while resuming; after every kill the directory must hold only whole shards, and resuming must
finish the dataset exactly as an uninterrupted writer would. Prints the figures; exits 1 on a failure.

    .venv/bin/python tools/stress_crash.py --workloads 60 --random-kills 20 --seed 0

Runs in /dev/shm when it exists (fsync is free there; a SIGKILL does not depend on it).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers_reliability import COMMIT_CALLS, count_calls, killed, make_records, run_killed_child  # noqa: E402
from tests.test_crash import (  # noqa: E402
    check_sharded_after_crash,
    kill_at_every_call,
    kill_while_appending,
    reference_layout,
    write_sharded,
)

import varstore  # noqa: E402
from varstore.format.manifest import MANIFEST_NAME


def random_workload(generator: random.Random) -> tuple[dict, list[bytes]]:
    options: dict = {"checksums": generator.random() < 0.7}
    if generator.random() < 0.5:
        options["max_shard_records"] = generator.randint(1, 12)
    else:
        options["max_shard_bytes"] = generator.randint(1, 3000)
    records = make_records(generator.randrange(1 << 30), generator.randint(5, 60), generator.choice([10, 300, 2000]))
    if generator.random() < 0.2:
        records.insert(generator.randrange(len(records)), bytes(generator.randint(1 << 20, 3 << 20)))
    return options, records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=60)
    parser.add_argument("--random-kills", type=int, default=20, help="kills at random moments per workload")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="varstore-stress-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    figures = {"workloads": 0, "kills before an OS call": 0, "kills while appending": 0, "kills while resuming": 0}
    started = time.monotonic()
    try:
        for number in range(arguments.workloads):
            generator = random.Random(arguments.seed * 1_000_003 + number)
            options, records = random_workload(generator)
            base = root / f"workload-{number}"
            base.mkdir()
            layout = reference_layout(base, records, options)
            figures["kills before an OS call"] += kill_at_every_call(
                base, lambda directory: write_sharded(directory, records, options),
                lambda directory: check_sharded_after_crash(directory, records, options, layout),
            )
            calls = len(count_calls(lambda: write_sharded(base / "count", records, options), COMMIT_CALLS))
            for run in range(arguments.random_kills):
                directory = base / f"random-{run}"
                figures["kills while appending"] += kill_while_appending(
                    directory, records, options, generator.randint(1, len(records) + 2))
                if run % 2 and directory.exists() and not (directory / MANIFEST_NAME).exists():  # kill the resume too
                    def resume(target: Path = directory) -> None:
                        with varstore.ShardedWriter(target, resume=True, **options) as writer:
                            writer.extend(records[len(writer) :])

                    status = run_killed_child(resume, generator.randint(1, calls))
                    figures["kills while resuming"] += killed(status)
                check_sharded_after_crash(directory, records, options, layout)
            figures["workloads"] += 1
            shutil.rmtree(base)
    except AssertionError as failure:
        print(f"FAILED in workload {figures['workloads']} (options {options}): {failure}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for name, value in figures.items():
            print(f"{name}: {value}")
        print(f"seconds: {time.monotonic() - started:.0f}")
    print("every committed shard was whole and every resumed dataset equalled the uninterrupted one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
