"""The kit's own wheel: what README "Install" decides. The kit runs from its checkout; a built wheel still
carries every patch (kit.paths.PATCHES), and installed without the checkout its CLI refuses in one line.

The wheel is built offline from a copy of the tracked package (pip wheel --no-deps --no-build-isolation
--no-index, with the test venv's setuptools), so the checkout gets no build/ or egg-info and CI downloads
nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kit.paths import KIT, PATCHES, REPO
from kit.sglang_src.mutants import MUTANTS


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into with pip --target)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    shutil.copytree(REPO / "kit", src / "kit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    flags = ["--no-deps", "--no-index", "--no-build-isolation"]
    subprocess.run([*pip, "wheel", *flags, "-w", str(root / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (root / "dist").glob("pr29654_kit-*.whl")
    target = root / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], check=True
    )
    return wheel, target


def test_the_wheel_carries_every_patch(installed: tuple[Path, Path]) -> None:
    wheel, target = installed
    shipped = sorted(p.relative_to(KIT.parent).as_posix() for p in PATCHES.rglob("*.patch"))
    assert len(shipped) == 1 + len(MUTANTS)  # the fix and every mutant
    with zipfile.ZipFile(wheel) as zf:
        assert sorted(n for n in zf.namelist() if n.endswith(".patch")) == shipped
    code = "from kit import paths as p; print(p.PR_PATCH.is_file(), len(list(p.PATCHES.rglob('*.patch'))))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=target.parent,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["True", str(1 + len(MUTANTS))]


@pytest.mark.parametrize("argv", [["verify", "x.whl"], ["analyze", "runs/x"], ["batch", "demo"]])
def test_the_installed_cli_refuses_in_one_line(installed: tuple[Path, Path], argv: list[str]) -> None:
    """The wheel's own `kit` script, the checkout nowhere on the path: exit 2 and the line that says how to
    install it, before the command touches anything."""
    _, target = installed
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run(
        [str(target / "bin" / "kit"), *argv], cwd=target.parent, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, proc.stderr
    assert line.startswith(
        f"kit {argv[0]}: error: the kit at {target / 'kit'} is installed without its checkout"
    )
    assert "pip install -e" in line
    assert not (target.parent / "runs").exists()
