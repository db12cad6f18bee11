"""kit.sglang_src.source: one reader for every form sglang comes in (offline, on the fake tree)."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from fake_sglang_helpers import make_fake_sglang

from kit.errors import InputError, ToolMissing
from kit.sglang_src import source
from kit.sglang_src.releases import install_hint
from kit.sglang_src.source import SglangSource, installed_sglang_dir, package_rel, shown

METADATA = "Metadata-Version: 2.1\nName: sglang\nVersion: 7.7.7+local\n\nBody: Version: 1.0\n"


def _forms(tmp_path: Path) -> dict[str, Path]:
    """The fake tree as a wheel, an unpacked root with dist-info, the package dir and a git checkout."""
    root = make_fake_sglang(tmp_path / "root")
    (root / "sglang" / "_version.py").write_text("__version__ = '7.7.7'\n")
    (root / "sglang-7.7.7+local.dist-info").mkdir()
    (root / "sglang-7.7.7+local.dist-info" / "METADATA").write_text(METADATA)
    wheel = tmp_path / "sglang-7.7.7+local-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(root).as_posix())
    checkout = tmp_path / "checkout"
    shutil.copytree(root / "sglang", checkout / "python" / "sglang")
    return {"wheel": wheel, "root": root, "package": root / "sglang", "checkout": checkout}


def test_every_form_reads_the_same_files(tmp_path: Path) -> None:
    forms = _forms(tmp_path)
    seen = {}
    for name, path in forms.items():
        with SglangSource(path) as src:
            files = src.files("srt")
            assert files and all(f.startswith("srt/") and f.endswith(".py") for f in files), name
            seen[name] = (sorted(files), src.read("srt/model_executor/model_runner.py"))
            assert src.read("srt/no_such.py") is None
    assert len({repr(v) for v in seen.values()}) == 1


def test_version_from_metadata_then_sources(tmp_path: Path) -> None:
    forms = _forms(tmp_path)
    for name in ("wheel", "root", "package"):
        with SglangSource(forms[name]) as src:
            assert src.version() == ("7.7.7+local", None), name
    with SglangSource(forms["checkout"]) as src:  # no dist-info next to python/sglang
        assert src.version() == ("7.7.7", None)
    (forms["root"] / "sglang-8.0.dist-info").mkdir()
    (forms["root"] / "sglang-8.0.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 8.0\n")
    with SglangSource(forms["root"]) as src:
        version, note = src.version()
    assert version == "7.7.7" and "several sglang dist-info dirs (7.7.7+local, 8.0)" in note


def test_parse_is_cached_and_names_syntax_errors(tmp_path: Path) -> None:
    root = make_fake_sglang(tmp_path)
    (root / "sglang" / "srt" / "broken.py").write_text("def f(:\n")
    with SglangSource(root) as src:
        rel = "srt/model_executor/model_runner.py"
        assert src.parse(rel) is src.parse(rel)
        assert src.parse("srt/broken.py") is None and src.syntax_error("srt/broken.py") is not None
        assert src.parse("srt/missing.py") is None and src.syntax_error("srt/missing.py") is None


def test_paths_as_reports_show_them() -> None:
    assert shown("srt/x.py") == "sglang/srt/x.py"
    assert package_rel(shown("srt/x.py")) == "srt/x.py"


def test_not_installed_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ToolMissing) as e:
        installed_sglang_dir()
    msg = str(e.value)
    assert e.value.tool == "sglang" and install_hint("bug") in msg and install_hint("fix") in msg
    assert "docs/" not in msg and "\n" not in msg


def test_an_interpreter_that_cannot_run_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot run"):
        installed_sglang_dir(str(tmp_path / "no-python"))


def test_one_locator_for_sglang_and_nvtx_here_and_in_another_interpreter(tmp_path: Path) -> None:
    """module_locations is the kit's one way to find a module in an environment (the installed sglang for
    `kit run` and the probe, nvtx for the preflight): located by find_spec, never imported, here or in
    another interpreter."""
    site = tmp_path / "site"
    (site / "boom").mkdir(parents=True)
    (site / "boom" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (site / "single.py").write_text("raise SystemExit('imported')\n")
    other = tmp_path / "python-other-env"
    other.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    other.chmod(0o755)
    assert source.module_locations("boom", str(other)) == [str(site / "boom")]
    assert source.module_locations("single", str(other)) == []
    assert source.module_locations("no_such_module_here", str(other)) is None
    assert source.module_locations("no_such_module_here") is None
    assert source.module_locations("json") == [str(Path(json.__file__).parent)]
    with pytest.raises(InputError, match="cannot run .* to locate nvtx"):
        source.module_locations("nvtx", str(tmp_path / "no-python"))


def test_one_reader_of_wheel_versus_checkout_layout(tmp_path: Path) -> None:
    """layout_root is where wheel paths (sglang/...) resolve: the tree itself, or a checkout's python/. The
    source reader and the patcher (so `kit patch-checkout` too) take the layout from it."""
    from kit.sglang_src.patch import apply_patch

    wheel = make_fake_sglang(tmp_path / "wheel")
    checkout = tmp_path / "checkout"
    make_fake_sglang(checkout / "python")
    assert source.layout_root(wheel) == wheel and source.layout_root(checkout) == checkout / "python"
    assert source.layout_root(tmp_path / "empty") is None
    new_file = "--- /dev/null\n+++ b/sglang/srt/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert apply_patch(checkout, new_file) == ["python/sglang/srt/new.py"]
    assert apply_patch(wheel, new_file) == ["sglang/srt/new.py"]
    with SglangSource(checkout) as a, SglangSource(wheel) as b:
        assert a.files() == b.files() and "srt/new.py" in a.files()
