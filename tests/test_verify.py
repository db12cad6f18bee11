"""kit.sglang_src.verify: AST classification of sglang sources as absent / bug / fix / unknown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from textwrap import dedent

import pytest
from wheels_fixtures import RELEASES, release_wheel, unpacked

from kit.cli import main as kit_main
from kit.errors import InputError
from kit.sglang_src import releases as registry
from kit.sglang_src.verify import detect_state

# ---------------------------------------------------------------------------------------------------
# Synthetic miniature trees (offline): the classifier follows the data flow, whatever the names.

FB_INFO = """
from dataclasses import dataclass
@dataclass
class ForwardBatch:
    {fields}
"""

EAGLE_INFO = """
from dataclasses import dataclass
@dataclass
class EagleDraftInput:
    topk_p: object = None
    {fields}
"""

NEXTN = """
class DeepseekModelNextN:
    def forward(self, input_ids, positions, forward_batch: ForwardBatch):
        hidden_states, residual, topk_indices = self.decoder(
            positions, forward_batch, prev_topk_indices={read}
        )
        {write}
        return hidden_states
"""

WORKER = """
class EagleDraftWorker:
    def draft_forward(self, forward_batch):
        spec_info = forward_batch.spec_info
        if self.index_share_for_mtp_iteration:
            forward_batch.{gate} = True
"""

STATE_MODULE = """
class ShareState:
    def __init__(self, forward_batch, topk_indices):
        self._forward_batch = forward_batch
        self._topk_indices = topk_indices

    @classmethod
    def from_carry(cls, forward_batch):
        t = forward_batch.spec_info.carried_topk if forward_batch.reuse_carried_topk else None
        return cls(forward_batch, t)

    @property
    def topk_indices(self):
        return self._topk_indices

    def publish(self):
        if self._forward_batch.reuse_carried_topk:
            self._forward_batch.spec_info.carried_topk = self._topk_indices

    def enter(self, forward_batch):
        forward_batch.reuse_carried_topk = True
"""

STATE_NEXTN = """
from sglang.srt.layers.share import ShareState

class DeepseekModelNextN:
    def forward(self, input_ids, positions, forward_batch):
        share = ShareState.from_carry(forward_batch)
        hidden_states, topk_indices = self.decoder(
            positions, forward_batch, prev_topk_indices=share.topk_indices
        )
        share.publish()
        return hidden_states
"""


def _mini(
    root: Path,
    *,
    nextn: str,
    fb_fields: str = "positions: object = None",
    ed_fields: str = "",
    worker: str | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    files = {
        "__init__.py": "",
        "_version.py": "__version__ = version = '9.9.9'\n",
        "srt/__init__.py": "",
        "srt/models/deepseek_nextn.py": nextn,
        "srt/model_executor/forward_batch_info.py": FB_INFO.format(fields=fb_fields),
        "srt/speculative/eagle_info.py": EAGLE_INFO.format(
            fields=ed_fields or "future_indices: object = None"
        ),
        **({"srt/speculative/eagle_worker_v2.py": worker} if worker else {}),
        **(extra or {}),
    }
    for rel, text in files.items():
        p = root / "sglang" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dedent(text))
    return root


def _nextn(read: str, write: str) -> str:
    return NEXTN.format(read=read, write=write)


NO_REUSE = (
    "class DeepseekModelNextN:\n    def forward(self, x, forward_batch):\n        return self.decoder(x)\n"
)
FB_READ = "(forward_batch.topk_indices if forward_batch.reuse_mtp_topk_indices else None)"
SPEC_READ = "(forward_batch.spec_info.carried if forward_batch.reuse_mtp_topk_indices else None)"
FB_FIELDS = "topk_indices: object = None\n    reuse_mtp_topk_indices: bool = False"


def test_synthetic_bug(tmp_path: Path) -> None:
    root = _mini(
        tmp_path,
        nextn=_nextn(FB_READ, "forward_batch.topk_indices = topk_indices"),
        fb_fields=FB_FIELDS,
        worker=WORKER.format(gate="reuse_mtp_topk_indices"),
    )
    res = detect_state(root)
    assert (res["state"], res["carrier"], res["version"]) == ("bug", "ForwardBatch.topk_indices", "9.9.9")
    files = {e["file"] for e in res["evidence"]}
    assert "sglang/srt/speculative/eagle_worker_v2.py" in files  # who switches the gate on
    assert "sglang/srt/model_executor/forward_batch_info.py" in files  # where the field lives


def test_synthetic_fix_on_spec_info(tmp_path: Path) -> None:
    root = _mini(
        tmp_path,
        nextn=_nextn(SPEC_READ, "forward_batch.spec_info.carried = topk_indices"),
        fb_fields="reuse_mtp_topk_indices: bool = False",
        ed_fields="carried: object = None",
        worker=WORKER.format(gate="reuse_mtp_topk_indices"),
    )
    res = detect_state(root)
    assert (res["state"], res["carrier"]) == ("fix", "EagleDraftInput.carried")


def test_synthetic_fix_through_a_local_alias(tmp_path: Path) -> None:
    nextn = _nextn(SPEC_READ, "si = forward_batch.spec_info\n        si.carried = topk_indices")
    worker = WORKER.format(gate="reuse_mtp_topk_indices")
    root = _mini(tmp_path, nextn=nextn, ed_fields="carried: object = None", worker=worker)
    assert detect_state(root)["state"] == "fix"


def test_synthetic_fix_through_a_state_object(tmp_path: Path) -> None:
    root = _mini(
        tmp_path,
        nextn=STATE_NEXTN,
        ed_fields="carried_topk: object = None",
        extra={"srt/layers/__init__.py": "", "srt/layers/share.py": STATE_MODULE},
    )
    res = detect_state(root)
    assert (res["state"], res["carrier"]) == ("fix", "ShareState")
    assert any(e["file"] == "sglang/srt/layers/share.py" for e in res["evidence"])


def test_synthetic_gate_never_switched_on_is_absent(tmp_path: Path) -> None:
    root = _mini(
        tmp_path, nextn=_nextn(FB_READ, "forward_batch.topk_indices = topk_indices"), fb_fields=FB_FIELDS
    )
    res = detect_state(root)
    assert res["state"] == "absent"
    assert any("nothing in sglang/srt sets it" in r for r in res["reasons"])


def test_synthetic_no_reuse_is_absent(tmp_path: Path) -> None:
    nextn = NO_REUSE
    res = detect_state(_mini(tmp_path, nextn=nextn))
    assert (res["state"], res["carrier"]) == ("absent", None)


def test_synthetic_mixed_carriers_are_unknown(tmp_path: Path) -> None:
    root = _mini(
        tmp_path,
        nextn=_nextn(SPEC_READ, "forward_batch.topk_indices = topk_indices"),
        fb_fields=FB_FIELDS,
        worker=WORKER.format(gate="reuse_mtp_topk_indices"),
    )
    res = detect_state(root)
    assert res["state"] == "unknown"
    assert any("never writes the new top-k there" in r for r in res["reasons"])


def test_synthetic_feature_elsewhere_but_nextn_silent_is_unknown(tmp_path: Path) -> None:
    nextn = NO_REUSE
    root = _mini(tmp_path, nextn=nextn, worker=WORKER.format(gate="reuse_mtp_topk_indices"))
    assert detect_state(root)["state"] == "unknown"


def test_tree_without_nextn_is_unknown_not_an_error(tmp_path: Path) -> None:
    root = _mini(tmp_path, nextn="")
    (root / "sglang/srt/models/deepseek_nextn.py").unlink()
    res = detect_state(root)
    assert res["state"] == "unknown" and res["reasons"]


# ---------------------------------------------------------------------------------------------------
# Unreadable inputs: one-line InputError naming the path and the cause


def _assert_one_line(e: pytest.ExceptionInfo[InputError], path: Path, cause: str) -> None:
    msg = str(e.value)
    assert str(path) in msg and cause in msg and "\n" not in msg


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        detect_state(tmp_path / "nope.whl")
    _assert_one_line(e, tmp_path / "nope.whl", "no such file")


def test_not_a_zip(tmp_path: Path) -> None:
    p = tmp_path / "fake.whl"
    p.write_text("not a zip")
    with pytest.raises(InputError) as e:
        detect_state(p)
    _assert_one_line(e, p, "not a zip")


def test_zip_without_sglang(tmp_path: Path) -> None:
    p = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("other/__init__.py", "")
    with pytest.raises(InputError) as e:
        detect_state(p)
    _assert_one_line(e, p, "no sglang package inside")


@pytest.mark.parametrize(
    "compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"]
)
def test_a_member_with_a_bad_crc_is_a_damaged_wheel(tmp_path: Path, compression: int) -> None:
    """The zip's directory is intact (it opens, it lists sglang/) but one member's bytes are not: stored,
    the CRC-32 check fails; deflated, the decompressor or the CRC does. Either is one line naming it."""
    import struct

    root = _mini(tmp_path / "tree", nextn=NO_REUSE)
    wheel, member = tmp_path / "sglang-9.9.9-py3-none-any.whl", "sglang/srt/models/deepseek_nextn.py"
    with zipfile.ZipFile(wheel, "w", compression) as zf:
        for f in sorted((root / "sglang").rglob("*.py")):
            zf.write(f, f.relative_to(root).as_posix())
        info = zf.getinfo(member)
    data = bytearray(wheel.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + info.compress_size // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        detect_state(wheel)
    _assert_one_line(e, wheel, f"damaged wheel: member {member} cannot be read")
    assert e.value.path == wheel


def test_dir_without_sglang(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        detect_state(tmp_path)
    _assert_one_line(e, tmp_path, "no sglang package inside")


def test_kit_verify_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nextn = NO_REUSE
    root = _mini(tmp_path, nextn=nextn)
    assert kit_main(["verify", str(root)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "absent" and set(out) == {"state", "version", "carrier", "evidence", "reasons"}


# ---------------------------------------------------------------------------------------------------
# Real releases (downloaded once, sha256-pinned, cached)


@pytest.mark.network
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_release_classifies(version: str) -> None:
    state, carrier = RELEASES[version]
    res = detect_state(release_wheel(version))
    assert (res["state"], res["carrier"], res["version"]) == (state, carrier, version), res["reasons"]
    assert res["reasons"]
    if state in ("bug", "fix"):
        assert any(e["file"] == "sglang/srt/models/deepseek_nextn.py" for e in res["evidence"])
        for e in res["evidence"]:
            assert e["line"] > 0 and e["source"]


def test_the_oracle_releases_are_in_the_registry() -> None:
    assert set(RELEASES) <= set(registry.RELEASES)


@pytest.mark.network
@pytest.mark.parametrize("version", list(registry.RELEASES))
def test_registry_says_what_verify_reads(version: str) -> None:
    """The registry's state and carrier for each release are what kit verify finds in that release."""
    r = registry.release(version)
    res = detect_state(release_wheel(version))
    assert (res["state"], res["carrier"], res["version"]) == (r.state, r.carrier, version), res["reasons"]


@pytest.mark.network
def test_every_input_form_agrees(tmp_path: Path) -> None:
    """Wheel, unpacked root (= site-packages layout), package dir, and a git-style python/ checkout."""
    wheel = release_wheel("0.5.14")
    tree = unpacked(wheel)
    checkout = tmp_path / "checkout"
    shutil.copytree(tree / "sglang" / "srt", checkout / "python" / "sglang" / "srt", copy_function=os.link)
    forms = {"wheel": wheel, "root": tree, "package": tree / "sglang", "checkout": checkout}
    results = {k: detect_state(p) for k, p in forms.items()}
    for k, res in results.items():
        assert (res["state"], res["carrier"]) == ("bug", "ForwardBatch.topk_indices"), k
    assert results["root"]["version"] == results["package"]["version"] == "0.5.14"
    assert results["checkout"]["version"] == "unknown"  # no dist-info, no _version.py


@pytest.mark.network
def test_cli_module_entry(tmp_path: Path) -> None:
    wheel = release_wheel("0.5.15")
    run = subprocess.run(
        [sys.executable, "-m", "kit.cli", "verify", str(wheel)], capture_output=True, text=True
    )
    assert run.returncode == 0 and json.loads(run.stdout)["state"] == "fix"
    bad = subprocess.run(
        [sys.executable, "-m", "kit.cli", "verify", str(tmp_path / "x")], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
