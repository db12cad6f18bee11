"""kit.sglang_src.build: the pure-Python patch applier and the patched, re-versioned 0.5.14+pr29654 wheel."""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheels_fixtures import PATCHED_FILES, patched_build, release_wheel, unpacked

from kit.errors import ExistsError, InputError, PatchError
from kit.paths import PR_PATCH
from kit.sglang_src.build import build_patched_wheel
from kit.sglang_src.patch import apply_patch
from kit.sglang_src.releases import BASELINE, PATCHED, pinned
from kit.sglang_src.verify import detect_state

# The build is named after the registry's baseline wheel, its version replaced by the patched one.
OUT_NAME = pinned(BASELINE)[0].replace(f"sglang-{BASELINE}-", f"sglang-{PATCHED}-")

# ---------------------------------------------------------------------------------------------------
# apply_patch on small synthetic trees (offline)

TWO_FILES = """\
# a header comment is ignored
--- a/pkg/one.py
+++ b/pkg/one.py
@@ -2,3 +2,3 @@
 b = 2
-c = 3
+c = 30
 d = 4
--- a/pkg/two.py
+++ b/pkg/two.py
@@ -1,2 +1,2 @@
-x = 1
+x = 10
 y = 2
@@ -5,2 +5,3 @@
 p = 5
 q = 6
+r = 7
"""


def _tree(tmp_path: Path, prefix: str = "") -> Path:
    root = tmp_path / "tree"
    (root / prefix / "pkg").mkdir(parents=True)
    (root / prefix / "pkg" / "one.py").write_text("a = 1\nb = 2\nc = 3\nd = 4\n")
    (root / prefix / "pkg" / "two.py").write_text("x = 1\ny = 2\nz = 3\no = 4\np = 5\nq = 6\n")
    return root


def test_apply_patch_changes_every_file(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert apply_patch(root, TWO_FILES) == ["pkg/one.py", "pkg/two.py"]
    assert (root / "pkg/one.py").read_text() == "a = 1\nb = 2\nc = 30\nd = 4\n"
    assert (root / "pkg/two.py").read_text() == "x = 10\ny = 2\nz = 3\no = 4\np = 5\nq = 6\nr = 7\n"


def test_apply_patch_allows_offsets(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "pkg/one.py").write_text("# new\n# lines\n# on top\na = 1\nb = 2\nc = 3\nd = 4\n")
    apply_patch(root, TWO_FILES)
    assert (root / "pkg/one.py").read_text() == "# new\n# lines\n# on top\na = 1\nb = 2\nc = 30\nd = 4\n"


def test_apply_patch_finds_python_dir_of_a_git_checkout(tmp_path: Path) -> None:
    root = _tree(tmp_path, prefix="python")
    assert apply_patch(root, TWO_FILES) == ["python/pkg/one.py", "python/pkg/two.py"]
    assert "c = 30" in (root / "python/pkg/one.py").read_text()


def test_apply_patch_is_all_or_nothing(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "pkg/two.py").write_text("x = 1\ny = 2\nz = 3\no = 4\np = 5\nQ = 6\n")
    before = {p: p.read_bytes() for p in (root / "pkg").iterdir()}
    with pytest.raises(PatchError) as e:
        apply_patch(root, TWO_FILES)
    assert (e.value.file, e.value.hunk) == ("pkg/two.py", 2)
    msg = str(e.value)
    assert "pkg/two.py" in msg and "hunk #2" in msg and "'q = 6'" in msg and "'Q = 6'" in msg
    assert "\n" not in msg
    assert {p: p.read_bytes() for p in (root / "pkg").iterdir()} == before  # one.py untouched too


def test_apply_patch_reports_an_applied_patch(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    apply_patch(root, TWO_FILES)
    with pytest.raises(PatchError, match=r"pkg/one.py hunk #1 .*applied already"):
        apply_patch(root, TWO_FILES)


def test_apply_patch_handles_missing_final_newline(tmp_path: Path) -> None:
    root = tmp_path
    (root / "f.txt").write_text("one\ntwo")
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n+TWO\n"
    apply_patch(root, patch)
    assert (root / "f.txt").read_text() == "one\nTWO\n"


@pytest.mark.parametrize(
    "text, match",
    [
        ("just prose\n", "no '--- a/<file>'"),
        ("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n", "ends early"),
        ("--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n", "unsafe path"),
    ],
)
def test_malformed_patches_are_refused(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        apply_patch(tmp_path, text)


def test_check_wheel_says_a_damaged_member_in_one_line(tmp_path: Path) -> None:
    """A wheel whose RECORD is right but one deflated member's bytes are damaged (zlib fails, not the zip
    directory): InputError, never a zlib.error traceback."""
    import struct

    from kit.sglang_src.wheelfile import check_wheel, record_bytes, record_row

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    files = {
        "pkg/a.py": ("x = 1\n" * 300).encode(),
        "pkg-1.0.dist-info/METADATA": b"Name: pkg\nVersion: 1.0\n\n",
    }
    record = "pkg-1.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(record, record_bytes([record_row(n, d) for n, d in files.items()], record))
        info = zf.getinfo("pkg/a.py")
    assert check_wheel(wheel)["files"] == 3
    data = bytearray(wheel.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len] ^= 0xFF  # the deflate stream's first header byte
    wheel.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"not a valid wheel \(.*(decompress|CRC)") as e:
        check_wheel(wheel)
    assert "\n" not in str(e.value) and e.value.path == wheel


def test_one_reader_of_a_wheels_metadata(tmp_path: Path) -> None:
    """wheel_metadata reads METADATA's headers (repeated Requires-Dist included) from the dist-info dir the
    filename implies, else the one the wheel has; scripts and tests read it there, never by hand."""
    from kit.sglang_src.wheelfile import wheel_metadata

    meta = (
        "Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0\nRequires-Dist: a>=1\n"
        "Requires-Dist: b; extra == 'x'\n\nRequires-Dist: prose in the description\n"
    )
    for di in ("pyyaml-6.0", "PyYAML-6.0"):
        wheel = tmp_path / di / "pyyaml-6.0-py3-none-any.whl"
        wheel.parent.mkdir()
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{di}.dist-info/METADATA", meta)
        got = wheel_metadata(wheel)
        assert (got["Name"], got["Version"]) == ("PyYAML", "6.0")
        assert got.get_all("Requires-Dist") == ["a>=1", "b; extra == 'x'"]
    (tmp_path / "bad-1.0-py3-none-any.whl").write_text("not a zip")
    with pytest.raises(InputError, match="METADATA can be read"):
        wheel_metadata(tmp_path / "bad-1.0-py3-none-any.whl")


def test_shipped_patch_header_explains_the_other_references() -> None:
    text = PR_PATCH.read_text()
    header = text.split("\n--- a/", 1)[0]
    for mention in ("standalone_worker_v2.py", "two_batch_overlap.py", "pp_proxy_tensors"):
        assert mention in header
    files = re.findall(r"^\+\+\+ b/(\S+)$", text, re.M)
    assert sorted(files) == PATCHED_FILES


# ---------------------------------------------------------------------------------------------------
# The real build (downloads the pinned 0.5.14 wheel once; cached in .cache/wheels)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def built() -> tuple[Path, dict]:
    return patched_build()


@pytest.mark.network
def test_out_dir_holds_wheel_and_manifest(built: tuple[Path, dict]) -> None:
    out, manifest = built
    assert sorted(p.name for p in out.iterdir()) == sorted([OUT_NAME, "manifest.json"])
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["input_wheel"] == pinned(BASELINE)[0]
    assert manifest["input_sha256"] == pinned(BASELINE)[1]
    assert manifest["output_wheel"] == OUT_NAME
    assert manifest["output_sha256"] == hashlib.sha256((out / OUT_NAME).read_bytes()).hexdigest()
    assert manifest["patch_sha256"] == hashlib.sha256(PR_PATCH.read_bytes()).hexdigest()
    assert manifest["files_changed"] == PATCHED_FILES
    assert manifest["kit_version"] and manifest["created_utc"]


@pytest.mark.network
def test_patched_wheel_is_a_valid_wheel(built: tuple[Path, dict]) -> None:
    out, _ = built
    di = f"sglang-{PATCHED}.dist-info"
    with zipfile.ZipFile(out / OUT_NAME) as zf:
        assert zf.testzip() is None
        files = {i.filename for i in zf.infolist() if not i.is_dir()}
        rows = list(csv.reader(io.StringIO(zf.read(f"{di}/RECORD").decode())))
        assert {r[0] for r in rows} == files
        for name, digest, size in rows:
            if name == f"{di}/RECORD":
                assert digest == "" and size == ""
                continue
            data = zf.read(name)
            assert (digest, size) == (_record_hash(data), str(len(data))), name
        meta = zf.read(f"{di}/METADATA").decode().partition("\n\n")[0]
        assert re.search(rf"^Version: {re.escape(PATCHED)}$", meta, re.M)
        assert re.search(r"^Name: sglang$", meta, re.M)
        assert not any(n.startswith(f"sglang-{BASELINE}.dist-info/") for n in zf.namelist())


@pytest.mark.network
def test_only_the_four_files_differ_from_the_release(built: tuple[Path, dict]) -> None:
    out, _ = built
    with zipfile.ZipFile(release_wheel(BASELINE)) as a, zipfile.ZipFile(out / OUT_NAME) as b:
        rename = {
            n: n.replace(f"sglang-{BASELINE}.dist-info", f"sglang-{PATCHED}.dist-info") for n in a.namelist()
        }
        assert sorted(rename.values()) == sorted(b.namelist())
        differ = sorted(n for n in a.namelist() if not n.endswith("/") and a.read(n) != b.read(rename[n]))
    di = f"sglang-{BASELINE}.dist-info"
    assert differ == sorted([*PATCHED_FILES, f"{di}/METADATA", f"{di}/RECORD"])


@pytest.mark.network
def test_patched_wheel_classifies_as_fix(built: tuple[Path, dict]) -> None:
    out, _ = built
    res = detect_state(out / OUT_NAME)
    assert res["state"] == "fix"
    assert res["carrier"] == "EagleDraftInput.mtp_topk_indices"
    assert res["version"] == PATCHED


@pytest.mark.network
def test_patched_tree_is_consistent(built: tuple[Path, dict]) -> None:
    """No code reads/writes ForwardBatch.topk_indices any more, and every patched file compiles."""
    out, _ = built
    tree = unpacked(out / OUT_NAME)
    offenders = []
    for py in sorted((tree / "sglang").rglob("*.py")):
        text = py.read_text(encoding="utf-8", errors="replace")
        if "topk_indices" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr == "topk_indices":
                base = node.value
                base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if base_name in ("forward_batch", "batch", "fb"):
                    offenders.append(f"{py.relative_to(tree)}:{node.lineno}")
    assert offenders == []
    for rel in PATCHED_FILES:
        compile((tree / rel).read_text(encoding="utf-8"), rel, "exec")

    fbi = ast.parse((tree / PATCHED_FILES[0]).read_text())
    fb_cls = next(n for n in ast.walk(fbi) if isinstance(n, ast.ClassDef) and n.name == "ForwardBatch")
    fields = {
        n.target.id for n in fb_cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert "topk_indices" not in fields and "reuse_mtp_topk_indices" in fields
    info = ast.parse((tree / PATCHED_FILES[2]).read_text())
    edi = next(n for n in ast.walk(info) if isinstance(n, ast.ClassDef) and n.name == "EagleDraftInput")
    field = next(
        n
        for n in edi.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "mtp_topk_indices"
    )
    assert ast.unparse(field.annotation) == "Optional[torch.Tensor]" and ast.unparse(field.value) == "None"


@pytest.mark.network
def test_pip_accepts_the_patched_wheel(built: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = built
    cmd = [
        sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
        "--only-binary=:all:",
        "--python-version", "3.12", "--platform", "manylinux_2_34_x86_64",
        "--target", str(tmp_path / "site"), str(out / OUT_NAME),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert (tmp_path / "site" / f"sglang-{PATCHED}.dist-info" / "METADATA").is_file()
    assert detect_state(tmp_path / "site" / "sglang")["state"] == "fix"


@pytest.mark.network
def test_build_is_reproducible(built: tuple[Path, dict], tmp_path: Path) -> None:
    _, first = built
    again = build_patched_wheel(BASELINE, tmp_path / "again")
    assert again["output_sha256"] == first["output_sha256"]


@pytest.mark.network
def test_corrupted_patch_names_file_and_hunk_and_leaves_nothing(tmp_path: Path) -> None:
    text = PR_PATCH.read_text()
    ctx = "\n             forward_batch.positions.add_(1)\n"  # context of eagle_worker_v2.py hunk #2
    assert text.count(ctx) == 1
    bad = text.replace(ctx, "\n             forward_batch.positions.add_(2)\n")
    out = tmp_path / "out"
    with pytest.raises(PatchError) as e:
        build_patched_wheel(BASELINE, out, patch_text=bad)
    assert (e.value.file, e.value.hunk) == ("sglang/srt/speculative/eagle_worker_v2.py", 2)
    msg = str(e.value)
    assert "sglang/srt/speculative/eagle_worker_v2.py" in msg and "hunk #2" in msg
    assert "first mismatching line" in msg and "add_(2)" in msg and "add_(1)" in msg
    assert "\n" not in msg
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("existing", [OUT_NAME, "manifest.json"])
def test_existing_output_is_never_overwritten(tmp_path: Path, existing: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / existing).write_text("sentinel")
    with pytest.raises(ExistsError, match=r"already exists.*another out dir"):
        build_patched_wheel(BASELINE, out)
    assert [p.name for p in out.iterdir()] == [existing]
    assert (out / existing).read_text() == "sentinel"
