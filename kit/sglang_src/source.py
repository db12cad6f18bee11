"""The one reader of sglang source: a wheel, an unpacked tree, a git checkout, a package dir or the installed
sglang, all read-only and never imported (sglang cannot be imported without its GPU stack).

Files are addressed relative to the package dir ('srt/models/deepseek_nextn.py'); `shown` gives the form
reports use ('sglang/srt/...'). Stdlib only: the probe runs this inside sglang's own interpreter.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from kit.errors import InputError, ToolMissing
from kit.sglang_src.releases import install_hint

PKG = "sglang"
CHECKOUT_DIR = "python"  # a git checkout of sglang keeps the package (and its pyproject.toml) here
_PREFIX = f"{PKG}/"
_METADATA_RE = re.compile(rf"{PKG}-[^/]+\.dist-info/METADATA")
_FORMS = "an sglang .whl, a dir holding sglang/ or python/sglang/, or the sglang package dir itself"


def shown(rel: str) -> str:
    """'srt/x.py' -> 'sglang/srt/x.py': how reports name a file (the wheel's own path)."""
    return _PREFIX + rel


def package_rel(path: str) -> str:
    """'sglang/srt/x.py' -> 'srt/x.py' (the inverse of `shown`)."""
    return path[len(_PREFIX) :] if path.startswith(_PREFIX) else path


class SglangSource:
    """Files of one sglang package; parsed modules are cached for the life of the source."""

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        self.label = str(path)
        self._zip: zipfile.ZipFile | None = None
        self._pkg: Path | None = None  # the package dir (…/sglang)
        self._names: list[str] = []  # zip members under sglang/, in the archive's order
        self._parsed: dict[str, ast.Module | SyntaxError | None] = {}
        if not path.exists():
            raise InputError(f"{path}: no such file or directory", path=path)
        if path.is_file():
            self._zip = _open_wheel(path)
            self._names = [n for n in self._zip.namelist() if n.startswith(_PREFIX)]
            if not self._names:
                self._zip.close()
                raise InputError(
                    f"{path}: no sglang package inside (the archive has no sglang/ directory)", path=path
                )
        else:
            self._pkg = _package_dir(path)

    def __enter__(self) -> SglangSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def read(self, rel: str) -> str | None:
        """The file's text (undecodable bytes replaced), or None when there is no such file."""
        if self._zip is not None:
            try:
                self._zip.getinfo(_PREFIX + rel)
            except KeyError:
                return None
            return self._member(_PREFIX + rel).decode("utf-8", errors="replace")
        p = self._pkg / rel
        try:
            return p.read_bytes().decode("utf-8", errors="replace") if p.is_file() else None
        except OSError as e:
            raise InputError(f"{self.label}: cannot read {p} ({e})", path=p) from None

    def files(self, under: str = "") -> list[str]:
        """The .py files below `under`, in the wheel's order (a directory's files before its subdirs)."""
        if self._zip is not None:
            pre = _PREFIX + (f"{under.rstrip('/')}/" if under else "")
            return [n[len(_PREFIX) :] for n in self._names if n.startswith(pre) and n.endswith(".py")]
        out = []
        for dirpath, dirs, names in os.walk(self._pkg / under):
            dirs.sort()
            rel_dir = Path(dirpath).relative_to(self._pkg).as_posix()
            out.extend(n if rel_dir == "." else f"{rel_dir}/{n}" for n in sorted(names) if n.endswith(".py"))
        return out

    def parse(self, rel: str) -> ast.Module | None:
        """The module's AST; None when the file is missing or does not parse (see `syntax_error`)."""
        if rel not in self._parsed:
            text = self.read(rel)
            try:
                self._parsed[rel] = ast.parse(text) if text is not None else None
            except SyntaxError as e:
                self._parsed[rel] = e
        tree = self._parsed[rel]
        return tree if isinstance(tree, ast.Module) else None

    def syntax_error(self, rel: str) -> SyntaxError | None:
        self.parse(rel)
        err = self._parsed[rel]
        return err if isinstance(err, SyntaxError) else None

    def version(self) -> tuple[str, str | None]:
        """(version, note): dist-info METADATA first (it carries local versions like +pr29654), then
        sglang/_version.py; 'unknown' when neither says. The note explains an ambiguous dist-info."""
        found = set()
        for text in self._metadata():
            head = text.partition("\n\n")[0]
            name = re.search(r"^Name: (.+)$", head, re.M)
            ver = re.search(r"^Version: (.+)$", head, re.M)
            if ver and (not name or name.group(1).strip().lower() == PKG):
                found.add(ver.group(1).strip())
        if len(found) == 1:
            return found.pop(), None
        note = None
        if len(found) > 1:
            note = f"several sglang dist-info dirs ({', '.join(sorted(found))}); version taken from sources"
        for rel in ("_version.py", "version.py"):
            tree = self.parse(rel)
            for node in tree.body if tree is not None else ():
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                    if "__version__" in names and isinstance(node.value.value, str):
                        return node.value.value, note
        return "unknown", note

    def _member(self, name: str) -> bytes:
        """A wheel member's bytes; a damaged member (bad CRC, corrupt deflate data, cut short) is the
        wheel's fault, said in one line."""
        assert self._zip is not None
        try:
            return self._zip.read(name)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise InputError(
                f"{self.label}: damaged wheel: member {name} cannot be read ({e}); "
                "download or build it again",
                path=self.label,
            ) from None

    def _metadata(self) -> list[str]:
        if self._zip is not None:
            return [
                self._member(n).decode("utf-8", errors="replace")
                for n in self._zip.namelist()
                if _METADATA_RE.fullmatch(n)
            ]
        out = []
        for meta in sorted(self._pkg.parent.glob(f"{PKG}-*.dist-info/METADATA")):
            try:
                out.append(meta.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
        return out


def _open_wheel(path: Path) -> zipfile.ZipFile:
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not a readable wheel: not a zip file (expected {_FORMS})", path=path)
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{path}: not a readable wheel ({e})", path=path) from None


def _is_pkg_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "srt").is_dir() or (p / "__init__.py").is_file())


def layout_root(tree: Path, top: str = PKG) -> Path | None:
    """The folder of `tree` that a wheel's paths (`sglang/srt/...`) are relative to: `tree` itself (an
    unpacked wheel, site-packages) or its python/ (a git checkout of sglang); None when neither holds a folder
    `top`. The one reader of wheel versus checkout layout: the patcher and `kit patch-checkout` use it too."""
    for root in (tree, tree / CHECKOUT_DIR):
        if (root / top).is_dir():
            return root
    return None


def _package_dir(path: Path) -> Path:
    """The sglang package inside an unpacked wheel / site-packages, a git checkout, or the dir itself."""
    root = layout_root(path)
    if root is not None and _is_pkg_dir(root / PKG):
        return root / PKG
    if (path.name == PKG and _is_pkg_dir(path)) or (path / "srt" / "models").is_dir():
        return path
    raise InputError(f"{path}: no sglang package inside (expected {_FORMS})", path=path)


_FIND_SPEC_SNIPPET = (
    "import importlib.util, json, sys; s = importlib.util.find_spec(sys.argv[1]); "
    "print(json.dumps(list(s.submodule_search_locations or []) if s else None))"
)


def module_locations(module: str, python: str | None = None) -> list[str] | None:
    """Where an interpreter would import the top-level `module` from, located with find_spec and never
    imported: its package dirs ([] for a single-file module), None when it cannot import it. The kit's one
    way to find sglang (and nvtx) in an environment.

    `python`: another interpreter (the sglang env); asked in a subprocess that only runs find_spec.
    """
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        spec = importlib.util.find_spec(module)
        return list(spec.submodule_search_locations or []) if spec else None
    try:
        out = subprocess.run(
            [python, "-c", _FIND_SPEC_SNIPPET, module], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError(f"cannot run {python} to locate {module}: {e}", path=python) from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip()[-300:]
        raise InputError(f"{python} failed to locate {module}: {tail}", path=python)
    return json.loads(out.stdout.strip().splitlines()[-1])


def installed_sglang_dir(python: str | None = None) -> Path:
    """The installed sglang package dir (module_locations; sglang itself is never imported)."""
    locations = module_locations(PKG, python)
    if not locations:
        who = python or sys.executable
        hints = f"bug: {install_hint('bug')}; fix: {install_hint('fix')}"
        raise ToolMissing(
            f"sglang is not installed for {who}: install the build the arm needs ({hints}) into an "
            "environment that has sglang's dependencies",
            tool=PKG,
        )
    return Path(locations[0])
