"""Set up the development environment in .venv and run a job: ``python3 tools/run.py demo|test [args]``.

Needs only Python 3.10+. The environment is (re)installed when pyproject.toml or
constraints.txt change; pytest's "no tests ran" (exit 5) counts as a failure.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / "varstore-install.sha256"
PYTEST_NO_TESTS = 5


def _install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def ensure_environment() -> None:
    fingerprint = _install_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint and PYTHON.exists():
        return
    if not PYTHON.exists():
        venv.create(VENV, with_pip=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + ["-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(fingerprint)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print("usage: python3 tools/run.py demo|test [extra arguments]", file=sys.stderr)
        return 2
    ensure_environment()
    job, extra = argv[0], argv[1:]
    if job == "demo":
        return subprocess.run([str(PYTHON), str(ROOT / "tools" / "demo.py"), *extra], cwd=ROOT).returncode
    code = subprocess.run([str(PYTHON), "-m", "pytest", "-q", *extra], cwd=ROOT).returncode
    if code == PYTEST_NO_TESTS:
        print("run.py: pytest collected no tests; that is a failure", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
