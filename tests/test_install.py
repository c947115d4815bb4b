"""The install story: a wheel built from the checkout installs into a fresh venv without torch, and works.

The wheel is built from a copy of the package sources (so the work tree gets no ``build/``) with the dev
venv's setuptools; a clean ``python -m venv`` then installs it with its base dependencies (numpy, msgpack,
crc32c) from the package index, as a user would. There is no offline fallback: if the index is unreachable
the fixture fails and says so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT = 150


@dataclass
class InstalledWheel:
    wheel: Path
    python: Path
    workdir: Path

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """Run a command from the venv's bin/ in an empty folder (so the checkout is not on sys.path)."""
        executable = self.python.parent / command[0]
        return subprocess.run(
            [str(executable), *command[1:]], cwd=self.workdir, capture_output=True, text=True, timeout=60
        )


def _copy_sources(destination: Path) -> None:
    """What the wheel is built from: the project metadata and the package, without caches."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(ROOT / "varstore", destination / "varstore", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _checked(command: list[str], what: str, timeout: float) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{what} failed (exit {result.returncode}): {' '.join(command)}\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    base = tmp_path_factory.mktemp("install")
    sources, wheels, environment, workdir = (base / name for name in ("src", "wheels", "venv", "work"))
    sources.mkdir()
    workdir.mkdir()
    _copy_sources(sources)
    _checked(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(sources)],
        "building the wheel",
        timeout=120,
    )
    (wheel,) = wheels.glob("varstore-*.whl")
    _checked([sys.executable, "-m", "venv", str(environment)], "creating a clean venv", timeout=120)
    python = environment / "bin" / "python"
    _checked(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--timeout", "30", str(wheel)],
        "installing the wheel and its dependencies (numpy, msgpack, crc32c) from the package index",
        timeout=PIP_TIMEOUT,
    )
    return InstalledWheel(wheel, python, workdir)


def test_wheel_holds_every_module_of_the_package(installed_wheel: InstalledWheel) -> None:
    with zipfile.ZipFile(installed_wheel.wheel) as archive:
        packed = {name for name in archive.namelist() if name.startswith("varstore/")}
    expected = {path.relative_to(ROOT).as_posix() for path in (ROOT / "varstore").rglob("*.py")}
    assert expected - packed == set(), "modules missing from the wheel"
    assert "varstore/py.typed" in packed


def test_wheel_imports_varstore_from_site_packages_without_torch(installed_wheel: InstalledWheel) -> None:
    check = (
        "import importlib.util, sys, varstore; "
        "assert importlib.util.find_spec('torch') is None, 'torch is installed'; "
        "assert 'torch' not in sys.modules; "
        "print(varstore.__file__)"
    )
    result = installed_wheel.run("python", "-c", check)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed_wheel.python.parent.parent), result.stdout


def test_varstore_torch_without_torch_says_which_extra_to_install(installed_wheel: InstalledWheel) -> None:
    result = installed_wheel.run("python", "-c", "import varstore.torch")
    assert result.returncode != 0
    assert "pip install 'varstore[torch]'" in result.stderr


def test_varstore_command_of_the_wheel_reads_a_store_its_python_wrote(installed_wheel: InstalledWheel) -> None:
    helped = installed_wheel.run("varstore", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "info" in helped.stdout
    write = "import varstore\nwith varstore.Writer('tiny', codec='bytes') as writer:\n    writer.extend([b'abc', b'de'])\n"
    written = installed_wheel.run("python", "-c", write)
    assert written.returncode == 0, written.stderr
    info = installed_wheel.run("varstore", "info", "tiny")
    assert info.returncode == 0, info.stderr
    assert "records    2" in info.stdout.splitlines()
    assert "payload    5 bytes, 2.5 bytes per record on average" in info.stdout
