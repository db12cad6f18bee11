"""kit.task.weights: the task checkpoint loads into sglang 0.5.14 unchanged (names, shapes, config), is the
same bytes for the same seed, carries the documented structure, and is labelled a task checkpoint only when
the reference answers the task."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from task_helpers import SMALL, task_checkpoint, task_model
from test_checkpoint import _header, check_fills

from kit import checkpoint as ck
from kit.errors import KitError
from kit.task import TASK_FORMAT, TaskSpec, make_task_checkpoint, read_task
from kit.task import make as tm
from kit.task import weights as tw
from kit.task.forward import read_safetensors, rms_norm

MODEL_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "task.json"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_config_is_kit_checkpoints_with_a_larger_vocabulary() -> None:
    out, manifest = task_checkpoint()
    cfg = json.loads((out / "config.json").read_text())
    spec = TaskSpec()
    assert cfg == ck.model_config({"vocab_size": spec.vocab_size}) and ck.sglang_constraints(cfg) == []
    assert cfg["vocab_size"] == 20672 == manifest["summary"]["vocab_size"]  # 4096 + 129 + 128^2, to x64
    assert (cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"]) == (2048, 64, 128)
    assert cfg["architectures"] == ["DeepseekV32ForCausalLM"] and cfg["index_share_for_mtp_iteration"]


def test_names_and_shapes_fill_every_sglang_param() -> None:
    """The loader check of tests/test_checkpoint.py, on the written file."""
    out, _ = task_checkpoint()
    cfg = json.loads((out / "config.json").read_text())
    header = _header(out / ck.WEIGHTS)
    specs = {s.name: s for s in ck.tensor_specs(cfg)}
    assert list(header) == list(specs)  # same names, same file order as kit.checkpoint
    for name, meta in header.items():
        assert tuple(meta["shape"]) == specs[name].shape and meta["dtype"] == specs[name].dtype
    read = check_fills(cfg, {k: tuple(v["shape"]) for k, v in header.items()})
    assert set(header) - read == {
        "model.layers.2.embed_tokens.weight",
        "model.layers.2.shared_head.head.weight",
    }


def test_manifest_records_every_file_and_says_why_it_is_not_labelled() -> None:
    out, manifest = task_checkpoint()
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {ck.MANIFEST}
    assert set(manifest["files"]) >= set(MODEL_FILES) | {"tokenizer_config.json", "special_tokens_map.json"}
    for name, meta in manifest["files"].items():
        assert _sha(out / name) == meta["sha256"] and (out / name).stat().st_size == meta["bytes"]
    assert manifest["self_check"] == {"ran": False}
    assert manifest["format"] == ck.FORMAT and manifest["task_checkpoint"] is False
    assert "NOT a task checkpoint" in manifest["task_note"]
    assert read_task(out) == TaskSpec() and manifest["task"] == TaskSpec().to_json()


def test_seed_0_is_the_pinned_bytes() -> None:
    """A GPU host that builds seed 0 can compare its sha256 with these (any machine, same bytes)."""
    _, manifest = task_checkpoint()
    got = {n: manifest["files"][n]["sha256"] for n in tm.REFERENCE_SHA256}
    assert got == tm.REFERENCE_SHA256, "task weights changed: if intended, update REFERENCE_SHA256"
    assert manifest["reference_match"] is True


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = make_task_checkpoint(tmp_path / "a", seed=3, self_check=False, **SMALL)
    b = make_task_checkpoint(tmp_path / "b", seed=3, self_check=False, **SMALL)
    c = make_task_checkpoint(tmp_path / "c", seed=4, self_check=False, **SMALL)
    for name in MODEL_FILES:
        assert a["files"][name]["sha256"] == b["files"][name]["sha256"] == _sha(tmp_path / "b" / name)
    for name in ("model.safetensors", "task.json"):
        assert a["files"][name]["sha256"] != c["files"][name]["sha256"]
    assert a["files"]["config.json"] == c["files"]["config.json"] and a["reference_match"] is None


def test_tokenizer_has_text_for_every_task_id() -> None:
    from transformers import AutoTokenizer

    out, _ = task_checkpoint()
    spec = read_task(out)
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    ids = [spec.node(0), spec.node(127), spec.unknown_id, spec.fact(5, 9), spec.vocab_size - 1]
    assert tok.decode(ids) == "<k0><k127><k?><f5:9><r62>"
    assert tok.encode("x <k3>", add_special_tokens=False)[-1] == spec.node(3)
    assert len(tok) == spec.vocab_size


def test_weights_have_the_documented_structure() -> None:
    out, _ = task_checkpoint()
    w = read_safetensors(out / ck.WEIGHTS)
    spec = read_task(out)
    h = 1024
    embed = w["model.embed_tokens.weight"]
    assert torch.allclose(embed.pow(2).mean(-1), torch.ones(len(embed)), rtol=1e-2)  # RMS 1 rows
    for p in ("model.layers.0", "model.layers.2"):
        q_b = w[f"{p}.self_attn.q_b_proj.weight"].view(16, 192, -1)
        assert (
            not q_b[:, 128:].any()
            and not w[f"{p}.self_attn.indexer.wq_b.weight"].view(64, 128, -1)[:, :64].any()
        )
        assert not w[f"{p}.self_attn.kv_a_proj_with_mqa.weight"][512:].any()  # k_pe is zero too
    assert not w["model.layers.1.self_attn.o_proj.weight"].any()
    assert all(not t.any() for n, t in w.items() if n.endswith("down_proj.weight"))
    eh = w["model.layers.2.eh_proj.weight"]
    assert torch.equal(eh[:, :h], torch.eye(h)) and not eh[:, h:].any()
    head = w["lm_head.weight"]
    rows = head.abs().sum(-1).nonzero().flatten().tolist()
    assert rows == [spec.node(k) for k in range(128)] + [spec.unknown_id]
    assert torch.equal(w["model.layers.2.shared_head.head.weight"], head)
    # the draft looks up another key for exactly the draft-miss keys
    dq = w["model.layers.2.self_attn.q_b_proj.weight"].view(16, 192, -1)[0, :128, :128].argmax(0)
    assert dq.tolist() == list(spec.draft_query) and len(spec.draft_misses()) == 16


def test_no_fp8_latent_tile_is_ever_all_zero() -> None:
    """sglang's quant_k_cache divides each 128-wide latent tile by its max with no epsilon: an all-zero
    tile is NaN in the fp8 KV cache, and NaN * 0 poisons even an attention whose o_proj is zero. Every
    layer's latent gets a pad per tile from the bias coordinate, which no layer writes."""
    m = task_model()
    bias = read_task(task_checkpoint()[0]).hidden_layout()["bias"]
    x_all = m.embed  # every token of the vocabulary, as the first layer sees it
    for layer in [*m.layers, m.draft]:
        lat, _ = layer.attn.kv(rms_norm(x_all, layer.in_norm, m.eps))
        assert (lat.view(len(lat), 4, 128).abs().amax(-1) > 0).all()
        assert not layer.attn.o_proj[bias].any()
    with pytest.raises(KitError, match="NaN"):
        m.layers[1].attn.kv(torch.zeros(1, 1024))


def test_self_check_labels_a_task_checkpoint_only_at_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = {"check_prompts": 1, "check_new_tokens": 12, **SMALL}
    good = make_task_checkpoint(tmp_path / "good", **kw)
    check = good["self_check"]
    assert good["format"] == TASK_FORMAT and good["task_checkpoint"] is True and check["passed"]
    for wl in ("same-target", "moving-target"):
        assert check[wl]["accuracy"] >= tm.SELF_CHECK_BAR
    assert check["moving-target"]["accept_length_fix"] < check["moving-target"]["accept_length_bug"]
    monkeypatch.setitem(tw.TASK_GAINS, "attn_k", 0.0)  # no lookup: every answer is <unknown>
    bad = make_task_checkpoint(tmp_path / "bad", **kw)
    assert bad["format"] == ck.FORMAT and bad["task_checkpoint"] is False
    assert not bad["self_check"]["passed"] and "accuracy 0.000 below 0.95" in bad["self_check"]["problem"]


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(KitError, match="seed"):
        make_task_checkpoint(tmp_path / "x", seed=-1, self_check=False)
    with pytest.raises(KitError, match="groups"):
        make_task_checkpoint(tmp_path / "x", n_keys=20, n_groups=3, self_check=False)
    with pytest.raises(KitError, match="draft_miss_per_group"):
        make_task_checkpoint(tmp_path / "x", n_keys=16, n_groups=4, draft_miss_per_group=4, self_check=False)
    with pytest.raises(KitError, match="hidden_size >= 515"):
        make_task_checkpoint(tmp_path / "x", overrides={"hidden_size": 512}, self_check=False)
    with pytest.raises(KitError, match="vocab_size is set by the task"):
        make_task_checkpoint(tmp_path / "x", overrides={"vocab_size": 4096}, self_check=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    with pytest.raises(KitError, match="new directory"):
        make_task_checkpoint(tmp_path / "busy", self_check=False)
    assert not (tmp_path / "x").exists()
