"""The benchmark's own virtual environment, ``.venv-bench``: varstore plus the peers, apart from the dev ``.venv``.

Standard library only: this runs under whatever ``python3`` started ``run.py``.
Installation follows the project's constraints (torch pinned to the local CPU
build). A peer that fails to install is left out here and reported as skipped
when its adapter fails to import.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-bench"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / "bench-install.sha256"
CONSTRAINTS = ROOT / "constraints.txt"
# The bench extra minus its peers: what the harness itself needs.
HARNESS = ["torch", "matplotlib>=3.6"]
# mosaicml-streaming pins numpy<2.2 and transformers<5, which cannot resolve beside torch 2.13 and
# datasets: it goes in without its dependencies, plus the ones its MDS code imports.
STREAMING = "mosaicml-streaming"
STREAMING_RUNTIME = ["transformers", "xxhash", "zstd", "Brotli", "python-snappy", "catalogue"]
# remote.py: the loopback S3 server (moto, as in the tests), the S3 clients of varstore (s3fs) and MDS/litdata
# (boto3), Lance (pylance, a peer there only), and pytest, which tests/helpers_fault_proxy.py (the latency proxy
# remote.py reuses) imports.
REMOTE = ["s3fs>=2024.1", "moto[s3]>=5", "flask", "flask-cors", "boto3", "pylance", "pytest"]


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", CONSTRAINTS, Path(__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _pip(*arguments: str) -> bool:
    command = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(CONSTRAINTS)]
    return subprocess.run([*command, *arguments]).returncode == 0


def _bench_extra() -> list[str]:
    import tomllib  # Python 3.11+; needed only when the extra fails to install as a whole

    with open(ROOT / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["project"]["optional-dependencies"]["bench"]


def _imports(module: str) -> bool:
    return subprocess.run([str(PYTHON), "-c", f"import {module}"], capture_output=True).returncode == 0


def _install() -> None:
    if not _pip("-e", f"{ROOT}[bench]"):
        print("bench: the bench extra did not install as a whole; installing its peers one by one", file=sys.stderr)
        if not _pip("-e", str(ROOT), *HARNESS):
            raise SystemExit("bench: cannot install varstore, torch and matplotlib into .venv-bench")
        for requirement in _bench_extra():
            _pip(requirement)
    if _pip("--no-deps", STREAMING):
        _pip(*STREAMING_RUNTIME)
    _pip(*REMOTE)
    # litdata pulls torchvision, whose only wheel here is a CUDA build that fails to load beside CPU torch.
    if not _imports("torchvision"):
        subprocess.run([str(PYTHON), "-m", "pip", "uninstall", "--quiet", "--yes", "torchvision"])


def ensure() -> Path:
    """Create or update ``.venv-bench`` when the project's requirements changed; returns its python."""
    fingerprint = _fingerprint()
    if PYTHON.exists() and STAMP.exists() and STAMP.read_text() == fingerprint:
        return PYTHON
    if not PYTHON.exists():
        venv.create(VENV, with_pip=True)
    _install()
    STAMP.write_text(fingerprint)
    return PYTHON


def active() -> bool:
    """Whether this interpreter is the one in ``.venv-bench``."""
    return Path(sys.prefix).resolve() == VENV.resolve()


def run_in_bench_venv(script: str) -> None:
    """Unless this is ``.venv-bench``'s interpreter: set it up if needed and run `script` again there, with the
    same arguments (this process is replaced)."""
    if not active():
        python = ensure()
        os.execv(python, [str(python), script, *sys.argv[1:]])
