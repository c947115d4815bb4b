"""Keep the CPUs busy, to show the test suite passes on a loaded machine (issue 23).

Starts ``--processes`` busy processes (default 4) that burn CPU until they are killed or ``--seconds`` pass
(default 3600; the bound makes a forgotten hog end by itself), and prints their pids. On a 2-core machine, 4
processes give a load average of about 4 on top of the tests' own, which is what the suite must pass under::

    python3 tools/cpu_hog.py --processes 4 --seconds 3000 & python3 tools/run.py test; kill %1

Killing the script (SIGTERM or SIGINT, as ``kill %1`` and Ctrl-C send) ends its busy processes too; each of them
also ends by itself at the deadline, or when the script is gone (killed with SIGKILL). Needs only Python 3.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time


def _burn(deadline: float, parent: int) -> None:
    """Spin until `deadline` (time.monotonic) or until the parent process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C in the terminal ends the busy processes at once
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    spins = 0
    while True:
        spins += 1
        if spins % 1_000_000 == 0 and (time.monotonic() >= deadline or os.getppid() != parent):
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4, help="busy processes to start (default 4)")
    parser.add_argument("--seconds", type=float, default=3600.0, help="stop after this many seconds (default 3600)")
    options = parser.parse_args(argv)
    if options.processes < 1:
        parser.error("--processes must be at least 1")
    if not 0 < options.seconds <= 24 * 3600:
        parser.error("--seconds must be above 0 and at most 86400")

    deadline = time.monotonic() + options.seconds
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    workers = [context.Process(target=_burn, args=(deadline, os.getpid()), daemon=True) for _ in range(options.processes)]
    for worker in workers:
        worker.start()
    print(f"cpu_hog: pid {os.getpid()}, {len(workers)} busy processes for at most {options.seconds:g} s: "
          + " ".join(str(worker.pid) for worker in workers), flush=True)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()) + 5)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        for worker in workers:
            worker.join(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
