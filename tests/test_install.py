"""The install story: a wheel built from the checkout installs into a fresh venv without torch, and works.

The wheel is built from a copy of the package sources (so the work tree gets no ``build/``) with the dev
venv's setuptools; a clean ``python -m venv`` then installs it with its base dependencies (numpy, msgpack,
crc32c) from the package index, as a user would. There is no offline fallback: if the index is unreachable
the fixture fails and says so.
"""

from __future__ import annotations

import os
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

    def run(self, *command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command from the venv's bin/ in an empty folder (so the checkout is not on sys.path), with
        `env` added to the environment."""
        executable = self.python.parent / command[0]
        return subprocess.run(
            [str(executable), *command[1:]], cwd=self.workdir, capture_output=True, text=True, timeout=60,
            env={**os.environ, **(env or {})},
        )


def _copy_sources(destination: Path) -> None:
    """What the wheel is built from: the project metadata, setup.py and the package, without caches or the
    work tree's built extension (so the wheel compiles varstore/_speedups.c, as a user's install does)."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(
        ROOT / "varstore", destination / "varstore", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd")
    )


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


def test_sources_the_wheel_is_built_from_hold_no_built_extension(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    assert (tmp_path / "setup.py").is_file() and (tmp_path / "varstore" / "_speedups.c").is_file()
    assert not [path.name for path in (tmp_path / "varstore").iterdir() if path.suffix in (".so", ".pyd")]


def test_wheel_compiles_the_c_extension_on_this_machine(installed_wheel: InstalledWheel) -> None:
    with zipfile.ZipFile(installed_wheel.wheel) as archive:
        built = [name for name in archive.namelist() if name.startswith("varstore/_speedups") and name.endswith(".so")]
    assert built, f"no compiled extension in {installed_wheel.wheel.name} (is gcc installed?)"
    assert not installed_wheel.wheel.name.endswith("-none-any.whl"), "a wheel with a C extension is platform-specific"
    check = "import varstore._native as native; assert native.speedups is not None, 'not built'; print(native.speedups.__file__)"
    result = installed_wheel.run("python", "-c", check)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed_wheel.python.parent.parent), result.stdout


_ROUND_TRIP = """
import numpy as np, varstore, varstore._native as native
assert native.speedups is {expected}
for codec, records in (("bytes", [b"abc", b"", b"d" * 70000]), ("str", ["h\u00e9", ""]), ("msgpack", [{{"a": [1, 2]}}, {{5: None}}])):
    with varstore.Writer(codec, codec) as writer:
        writer.extend(records)
    with varstore.open(codec) as reader:
        assert list(reader) == records and reader.get_batch([-1, 0]) == [records[-1], records[0]], codec
        assert reader[len(records) - 1] == records[-1]
        reader.verify()
print("ok")
"""


@pytest.mark.parametrize("disabled", [False, True], ids=["with the extension", "VARSTORE_NO_EXTENSION=1"])
def test_wheel_writes_reads_and_verifies_with_and_without_the_extension(installed_wheel: InstalledWheel, disabled: bool) -> None:
    (installed_wheel.workdir / ("disabled" if disabled else "enabled")).mkdir()
    script = f"import os; os.chdir({'disabled' if disabled else 'enabled'!r})\n" + _ROUND_TRIP.format(expected="None" if disabled else "not None")
    result = installed_wheel.run("python", "-c", script, env={"VARSTORE_NO_EXTENSION": "1" if disabled else "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
