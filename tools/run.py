"""Set up .venv and run a job: ``python3 tools/run.py demo|test [args]``.

Needs only Python 3.10+. ``demo`` installs varstore with its base dependencies only, so a
first run shows the product in seconds; ``test`` adds the ``dev`` extra (torch pinned by
constraints.txt, pytest, hypothesis, ...). A stamp in .venv records which level is installed
for which pyproject.toml and constraints.txt, so a change to either reinstalls, ``test`` upgrades
a demo-level venv and ``demo`` after ``test`` installs nothing. Each set-up step prints one line
and its duration; pip's output is shown only when it fails. pytest's "no tests ran" (exit 5)
counts as a failure.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / "varstore-install.stamp"
PYTEST_NO_TESTS = 5
LEVELS = ("demo", "test")  # each level includes the ones before it


def _install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt", "setup.py", "varstore/_speedups.c"):  # the C extension builds at install
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def _installed_level(fingerprint: str) -> str | None:
    """The level the stamp says is installed for this fingerprint, or None (no venv, or stale)."""
    if not PYTHON.exists() or not STAMP.exists():
        return None
    level, _, stamped = STAMP.read_text().partition(" ")
    return level if stamped == fingerprint and level in LEVELS else None


def _requirement_names(array: str) -> list[str]:
    """Distribution names in one of pyproject.toml's string arrays (``dependencies`` or an extra), for the progress lines."""
    text = (ROOT / "pyproject.toml").read_text()
    body = re.search(rf"^{array} = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    return re.findall(r'^\s*"([A-Za-z0-9_.-]+)', body.group(1), re.MULTILINE) if body else []


def _step(message: str, action) -> None:
    """Print what is being done, do it, and print how long it took."""
    print(f"run.py: {message} ...", end="", flush=True)
    start = time.perf_counter()
    action()
    print(f" done in {time.perf_counter() - start:.1f} s", flush=True)


def _pip_install(*requirements: str) -> None:
    """pip install into .venv with the constraints; pip's output is printed only if it fails."""
    command = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    command += ["-c", str(ROOT / "constraints.txt"), *requirements]
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        print(f"\n{result.stdout}run.py: pip failed (exit {result.returncode}): {' '.join(command)}", file=sys.stderr)
        sys.exit(1)


def _test_extras_summary() -> str:
    names = _requirement_names("dev")
    torch_pin = re.search(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    return ", ".join(f"torch {torch_pin.group(1)} CPU" if name == "torch" and torch_pin else name for name in names)


def ensure_environment(level: str) -> None:
    """Create .venv and install what ``level`` needs, unless the stamp says it is already there."""
    fingerprint = _install_fingerprint()
    installed = _installed_level(fingerprint)
    if installed is not None and LEVELS.index(installed) >= LEVELS.index(level):
        return
    if not PYTHON.exists():
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        _step(f"creating .venv (python {version})", lambda: venv.create(VENV, with_pip=True))
    if installed is None:
        STAMP.unlink(missing_ok=True)
        base = _requirement_names("dependencies")
        _step(
            f"installing varstore and its {len(base)} dependencies ({', '.join(base)})",
            lambda: _pip_install("-e", str(ROOT)),
        )
        STAMP.write_text(f"demo {fingerprint}")
    if level == "test":
        _step(f"installing test extras ({_test_extras_summary()})", lambda: _pip_install("-e", f"{ROOT}[dev]"))
        STAMP.write_text(f"test {fingerprint}")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in LEVELS:
        print("usage: python3 tools/run.py demo|test [extra arguments]", file=sys.stderr)
        return 2
    job, extra = argv[0], argv[1:]
    ensure_environment(job)
    if job == "demo":
        return subprocess.run([str(PYTHON), str(ROOT / "tools" / "demo.py"), *extra], cwd=ROOT).returncode
    code = subprocess.run([str(PYTHON), "-m", "pytest", "-q", *extra], cwd=ROOT).returncode
    if code == PYTEST_NO_TESTS:
        print("run.py: pytest collected no tests; that is a failure", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
