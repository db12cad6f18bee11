"""kit.backends.sglang.checkpoint / `kit make-checkpoint`: the small DSA+MTP checkpoint sglang 0.5.14 serves.

The shape check is independent of the generator: it encodes sglang 0.5.14's parameters (deepseek_v2.py,
deepseek_nextn.py, dsa_indexer.py) and its loader's renaming rules (deepseek_weight_loader.py) here, and
requires every sglang parameter to be filled exactly once and no checkpoint tensor to be left unread.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from kit import checkpoint as ck
from kit.checkpoint import files as ckfiles
from kit.cli import build_parser, main
from kit.cli.commands import cmd_make_checkpoint
from kit.errors import KitError
from kit.paths import REPO

# Small but kernel-legal sizes: everything sglang_constraints pins stays at the default.
TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "q_lora_rank": 64,
}
MODEL_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]


@pytest.fixture(scope="module")
def default_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The real default checkpoint, made through the CLI as a user would (about 250 MB, a few seconds)."""
    out = tmp_path_factory.mktemp("ckpt") / "dsa-mtp"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["make-checkpoint", str(out)]) == 0
    return out, json.loads(buf.getvalue())


def _header(path: Path) -> dict[str, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__")
    return header


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# sglang 0.5.14's side, written down independently


def sglang_params(cfg: dict, nextn: bool) -> dict[str, tuple[int, ...]]:
    """Parameters of DeepseekV32ForCausalLM (nextn=False) or DeepseekV3ForCausalLMNextN at TP1.

    Shared experts stay unfused (determine_num_fused_shared_experts: the arch is not DeepseekV3ForCausalLM
    and 8 experts are not 256), q_a_proj/kv_a_proj_with_mqa are fused (q_lora_rank is set).
    """
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads, ql, kvl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ih, idim, e, im = (
        cfg["index_n_heads"],
        cfg["index_head_dim"],
        cfg["n_routed_experts"],
        cfg["moe_intermediate_size"],
    )

    def layer(p: str, moe: bool) -> dict[str, tuple[int, ...]]:
        a = f"{p}.self_attn"
        d = {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{a}.fused_qkv_a_proj_with_mqa.weight": (ql + kvl + rope, h),
            f"{a}.q_a_layernorm.weight": (ql,),
            f"{a}.q_b_proj.weight": (heads * (nope + rope), ql),
            f"{a}.kv_a_layernorm.weight": (kvl,),
            f"{a}.kv_b_proj.weight": (heads * (nope + vd), kvl),
            f"{a}.o_proj.weight": (h, heads * vd),
            f"{a}.indexer.wq_b.weight": (ih * idim, ql),
            f"{a}.indexer.wk.weight": (idim, h),
            f"{a}.indexer.weights_proj.weight": (ih, h),
            f"{a}.indexer.k_norm.weight": (idim,),
            f"{a}.indexer.k_norm.bias": (idim,),
        }
        if moe:
            d |= {
                f"{p}.mlp.gate.weight": (e, h),
                f"{p}.mlp.gate.e_score_correction_bias": (e,),
                f"{p}.mlp.experts.w13_weight": (e, 2 * im, h),
                f"{p}.mlp.experts.w2_weight": (e, h, im),
                f"{p}.mlp.shared_experts.gate_up_proj.weight": (2 * im, h),
                f"{p}.mlp.shared_experts.down_proj.weight": (h, im),
            }
        else:
            inter = cfg["intermediate_size"]
            d |= {f"{p}.mlp.gate_up_proj.weight": (2 * inter, h), f"{p}.mlp.down_proj.weight": (h, inter)}
        return d

    if nextn:  # embed_tokens and lm_head come from the target (set_embed_and_head), not from the file
        return {
            "model.enorm.weight": (h,),
            "model.hnorm.weight": (h,),
            "model.eh_proj.weight": (h, 2 * h),
            "model.shared_head.norm.weight": (h,),
            **layer("model.decoder", True),
        }
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        out |= layer(f"model.layers.{i}", i >= cfg["first_k_dense_replace"])
    return out


def load_plan(cfg: dict, names: list[str], nextn: bool) -> list[tuple[str, str, tuple]]:
    """(checkpoint name, sglang param, where in the param) for each tensor sglang reads; others dropped."""
    n = cfg["num_hidden_layers"]
    im, inter, ql = cfg["moe_intermediate_size"], cfg["intermediate_size"], cfg["q_lora_rank"]
    kvr = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    plan = []
    for orig in names:
        name = orig
        if (
            nextn
        ):  # only model.layers.{n}; NextN-only parts go to model.*, the decoder layer to model.decoder.*
            prefix = f"model.layers.{n}"
            if not name.startswith(prefix + ".") or "shared_head.head" in name or "embed_tokens" in name:
                continue
            special = any(s in name for s in ("shared_head.norm", "eh_proj", "enorm", "hnorm"))
            name = name.replace(prefix, "model" if special else "model.decoder")
        elif name.startswith("model.layers.") and int(name.split(".")[2]) >= n:
            continue  # the target skips layers >= num_hidden_layers (the NextN layer)
        if ".mlp.experts." in name:
            head, tail = name.split(".mlp.experts.")
            expert, proj = int(tail.split(".")[0]), tail.split(".")[1]
            if proj == "down_proj":
                plan.append((orig, f"{head}.mlp.experts.w2_weight", ("expert", expert)))
            else:
                rows = (0, im) if proj == "gate_proj" else (im, 2 * im)
                plan.append((orig, f"{head}.mlp.experts.w13_weight", ("expert_rows", expert, rows)))
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            size = im if "shared_experts" in name else inter
            proj = "gate_proj" if name.endswith("gate_proj.weight") else "up_proj"
            rows = (0, size) if proj == "gate_proj" else (size, 2 * size)
            plan.append((orig, name[: -len(proj + ".weight")] + "gate_up_proj.weight", ("rows", rows)))
        elif name.endswith(("q_a_proj.weight", "kv_a_proj_with_mqa.weight")):
            stem = name.rsplit(".", 2)[0]
            rows = (0, ql) if name.endswith("q_a_proj.weight") else (ql, ql + kvr)
            plan.append((orig, f"{stem}.fused_qkv_a_proj_with_mqa.weight", ("rows", rows)))
        else:
            plan.append((orig, name, ("all",)))
    return plan


def check_fills(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """Assert sglang would fill every parameter exactly once with matching shapes; returns names read."""
    read: set[str] = set()
    for nextn in (False, True):
        params = sglang_params(cfg, nextn)
        filled: dict[str, int] = dict.fromkeys(params, 0)
        names = list(shapes)
        for orig, param, where in load_plan(cfg, names, nextn):
            assert param in params, f"{'NextN' if nextn else 'target'}: {orig} -> {param}, no such param"
            got, want = shapes[orig], params[param]
            if where[0] == "all":
                assert got == want, f"{orig}: {got} != {param} {want}"
                filled[param] += int(np.prod(want))
            elif where[0] == "rows":
                lo, hi = where[1]
                assert got == (hi - lo, *want[1:]), f"{orig}: {got} != rows {lo}:{hi} of {want}"
                filled[param] += int(np.prod(got))
            elif where[0] == "expert":
                assert got == want[1:], f"{orig}: {got} != one expert of {want}"
                filled[param] += int(np.prod(got))
            else:
                lo, hi = where[2]
                assert got == (hi - lo, want[2]), f"{orig}: {got} != rows {lo}:{hi} of an expert of {want}"
                filled[param] += int(np.prod(got))
            read.add(orig)
        for param, shape in params.items():
            assert filled[param] == int(np.prod(shape)), f"{param} {shape}: {filled[param]} elements filled"
    return read


# ---------------------------------------------------------------------------------------------------
# config and shapes


def test_default_config_passes_the_constraints_and_is_v32_shaped() -> None:
    cfg = ck.model_config()
    assert ck.sglang_constraints(cfg) == []
    assert cfg["architectures"] == ["DeepseekV32ForCausalLM"]
    # Not V3.2's "deepseek_v32": transformers 5.8.1 (sglang 0.5.14's pin) cannot parse that outside sglang.
    assert cfg["model_type"] == "deepseek_v3"
    assert (cfg["index_topk"], cfg["index_head_dim"], cfg["index_n_heads"]) == (2048, 128, 64)
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["index_share_for_mtp_iteration"] is True
    assert cfg["max_position_embeddings"] >= 131072
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"num_attention_heads": 24}, "num_attention_heads=24"),
        ({"num_attention_heads": 1}, "num_attention_heads=1"),
        ({"kv_lora_rank": 256}, "kv_lora_rank must be 512"),
        ({"index_n_heads": 32}, "index_head_dim/index_n_heads/index_topk"),
        ({"n_routed_experts": 12}, "experts 12/"),
        ({"n_group": 8}, "experts 8/groups 8"),
        ({"num_hidden_layers": 1}, "num_hidden_layers must be >= 2"),
        ({"hidden_size": 100}, "hidden_size=100"),
    ],
)
def test_configs_the_sm90_kernels_reject_are_refused(tmp_path: Path, override: dict, needle: str) -> None:
    assert any(needle in line for line in ck.sglang_constraints(ck.model_config(override)))
    with pytest.raises(KitError, match="checkpoint config rejected"):
        ck.make_checkpoint(tmp_path / "x", overrides={**TINY, **override})
    assert not (tmp_path / "x").exists()


def test_unknown_override_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KitError, match="unknown checkpoint config key 'hidden'"):
        ck.make_checkpoint(tmp_path / "x", overrides={"hidden": 8})


def test_default_spec_fills_every_sglang_param_without_allocating() -> None:
    """The real default config, from the spec alone: names and shapes against sglang's loader rules."""
    cfg = ck.model_config()
    shapes = {s.name: s.shape for s in ck.tensor_specs(cfg)}
    read = check_fills(cfg, shapes)
    n = cfg["num_hidden_layers"]
    unread = set(shapes) - read
    # Real V3 checkpoints carry these too; sglang's NextN loader skips them (the draft shares the target's).
    assert unread == {f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.shared_head.head.weight"}
    moe_layers = {k.split(".")[2] for k in shapes if ".mlp.experts." in k}
    assert moe_layers == {"1", "2"} and f"model.layers.{n}.mlp.gate.e_score_correction_bias" in shapes


def test_loader_check_can_fail() -> None:
    cfg = ck.model_config(TINY)
    shapes = {s.name: s.shape for s in ck.tensor_specs(cfg)}
    missing = {k: v for k, v in shapes.items() if "indexer.wk" not in k}
    with pytest.raises(AssertionError, match="indexer.wk.weight"):
        check_fills(cfg, missing)
    wrong = {**shapes, "model.layers.0.self_attn.o_proj.weight": (64, 64)}
    with pytest.raises(AssertionError, match="o_proj"):
        check_fills(cfg, wrong)


# ---------------------------------------------------------------------------------------------------
# the written checkpoint


def test_cli_writes_the_default_checkpoint(default_ckpt: tuple[Path, dict]) -> None:
    out, manifest = default_ckpt
    assert manifest == json.loads((out / ck.MANIFEST).read_text())
    assert manifest["seed"] == 0 and manifest["summary"]["num_attention_heads"] == 16
    assert manifest["tokenizer_checked_with"]  # tokenizers is installed with transformers
    for name, meta in manifest["files"].items():
        assert _sha(out / name) == meta["sha256"] and (out / name).stat().st_size == meta["bytes"]
    assert set(manifest["files"]) >= set(MODEL_FILES) | {"tokenizer_config.json"}
    assert json.loads((out / "config.json").read_text()) == ck.model_config()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1
    assert not list(out.parent.glob(".*partial*"))


def test_default_checkpoint_is_the_reference_bytes(default_ckpt: tuple[Path, dict]) -> None:
    """Same bytes on any machine (numpy PCG64 + own bf16/safetensors writer): the GPU host can compare."""
    out, manifest = default_ckpt
    assert set(ck.REFERENCE_SHA256) >= set(MODEL_FILES)
    got = {n: manifest["files"][n]["sha256"] for n in ck.REFERENCE_SHA256}
    assert got == ck.REFERENCE_SHA256, "weights changed: if intended, update checkpoint.REFERENCE_SHA256"
    assert manifest["reference_match"] is True


def test_file_header_matches_the_spec_and_sglang(default_ckpt: tuple[Path, dict]) -> None:
    out, _ = default_ckpt
    cfg = ck.model_config()
    header = _header(out / ck.WEIGHTS)
    specs = {s.name: s for s in ck.tensor_specs(cfg)}
    assert set(header) == set(specs)
    for name, meta in header.items():
        assert tuple(meta["shape"]) == specs[name].shape
        assert meta["dtype"] == ("F32" if name.endswith("e_score_correction_bias") else "BF16")
    check_fills(cfg, {k: tuple(v["shape"]) for k, v in header.items()})


def test_weights_load_with_safetensors_and_have_the_documented_structure(
    default_ckpt: tuple[Path, dict],
) -> None:
    out, _ = default_ckpt
    cfg = ck.model_config()
    h, vocab, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    with safe_open(str(out / ck.WEIGHTS), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        get = f.get_tensor
        embed, head = get("model.embed_tokens.weight").float(), get("lm_head.weight").float()
        nxt = torch.from_numpy(ck.next_token_cycle(0, vocab))
        ordinary = torch.arange(3, vocab)
        assert torch.equal(
            head[nxt[ordinary]], (embed[ordinary] * (ck.GAINS["lm_head"] / h)).bfloat16().float()
        )
        assert not head[:3].any()  # special tokens are never the argmax
        assert sorted(nxt[ordinary].tolist()) == ordinary.tolist()  # a permutation ...
        t, seen = 3, set()
        while t not in seen:
            seen.add(t)
            t = int(nxt[t])
        assert len(seen) == vocab - 3  # ... and one cycle: greedy never loops early
        assert torch.equal(get(f"model.layers.{n}.embed_tokens.weight"), get("model.embed_tokens.weight"))
        assert torch.equal(get(f"model.layers.{n}.shared_head.head.weight"), get("lm_head.weight"))
        eh = get(f"model.layers.{n}.eh_proj.weight").float()
        assert torch.equal(eh[:, :h], torch.eye(h)) and 0 < eh[:, h:].abs().max() < 0.05
        assert torch.equal(get("model.layers.1.mlp.gate.e_score_correction_bias"), torch.zeros(8))
        assert torch.equal(get("model.layers.0.self_attn.indexer.k_norm.weight").float(), torch.ones(128))
        assert embed.std().item() == pytest.approx(1.0, rel=0.02)
        q_a = get("model.layers.0.self_attn.q_a_proj.weight").float()
        assert q_a.std().item() == pytest.approx(h**-0.5, rel=0.02)
        for name in f.keys():
            assert torch.isfinite(get(name).float()).all(), name


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = ck.make_checkpoint(tmp_path / "a", seed=3, overrides=TINY)
    b = ck.make_checkpoint(tmp_path / "b", seed=3, overrides=TINY)
    c = ck.make_checkpoint(tmp_path / "c", seed=4, overrides=TINY)
    for name in MODEL_FILES:
        assert a["files"][name]["sha256"] == b["files"][name]["sha256"] == _sha(tmp_path / "b" / name)
    assert a["files"][ck.WEIGHTS]["sha256"] != c["files"][ck.WEIGHTS]["sha256"]
    assert a["files"]["config.json"] == c["files"]["config.json"]
    assert a["reference_match"] is None and a["overrides"] == TINY


def test_tiny_checkpoint_also_fills_sglang(tmp_path: Path) -> None:
    ck.make_checkpoint(tmp_path / "t", overrides=TINY)
    header = _header(tmp_path / "t" / ck.WEIGHTS)
    check_fills(ck.model_config(TINY), {k: tuple(v["shape"]) for k, v in header.items()})


# ---------------------------------------------------------------------------------------------------
# out directory handling


def test_refuses_a_non_empty_out_dir_and_leaves_it_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(KitError) as e:
        ck.make_checkpoint(out, overrides=TINY)
    msg = str(e.value)
    assert str(out) in msg and "new directory" in msg and "\n" not in msg
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main(["make-checkpoint", str(out)]) == 2
    assert "kit make-checkpoint: error:" in capsys.readouterr().err


def test_accepts_an_empty_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    ck.make_checkpoint(out, overrides=TINY)
    assert (out / ck.WEIGHTS).exists() and (out / ck.MANIFEST).exists()


def test_an_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckfiles, "write_safetensors", boom)
    with pytest.raises(OSError, match="disk full"):
        ck.make_checkpoint(tmp_path / "x", overrides=TINY)
    assert list(tmp_path.iterdir()) == []


def test_bad_seed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KitError, match="seed"):
        ck.make_checkpoint(tmp_path / "x", seed=-1, overrides=TINY)


def test_gain_override_rebuilds_the_first_h200_runs_checkpoint(tmp_path: Path) -> None:
    """`--gain attn_out=5.5` gives back, byte for byte, the weights the first H200 runs used (the sha256
    their install/checkpoint.json recorded), so those runs stay reproducible."""
    recorded = json.loads((REPO / "data/results/h200-sglang/v1/install/checkpoint.json").read_text())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["make-checkpoint", str(tmp_path / "v1"), "--gain", "attn_out=5.5"]) == 0
    manifest = json.loads(buf.getvalue())
    assert manifest["gains"] == {**ck.GAINS, "attn_out": 5.5} == recorded["gains"]
    assert manifest["files"][ck.WEIGHTS] == recorded["files"][ck.WEIGHTS]
    assert manifest["reference_match"] is None  # not the default checkpoint, so no claim either way
    assert manifest["files"][ck.WEIGHTS]["sha256"] != ck.REFERENCE_SHA256[ck.WEIGHTS]


def test_bad_gains_are_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    with pytest.raises(KitError, match="unknown checkpoint gain 'atn_out'; known gains: attn_out"):
        ck.make_checkpoint(tmp_path / "x", overrides=TINY, gains={"atn_out": 2.0})
    with pytest.raises(KitError, match="must be a positive number"):
        ck.make_checkpoint(tmp_path / "x", overrides=TINY, gains={"attn_out": -1.0})
    assert main(["make-checkpoint", str(tmp_path / "x"), "--gain", "attn_out"]) == 2
    assert "expected NAME=NUMBER" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_parses_seed() -> None:
    args = build_parser().parse_args(["make-checkpoint", "somewhere", "--seed", "7"])
    assert (args.out, args.seed, args.func) == ("somewhere", 7, cmd_make_checkpoint)


# ---------------------------------------------------------------------------------------------------
# tokenizer and config as transformers reads them, offline


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


TEXTS = [
    "Record 17: a shipment of 42 crates of olive oil left Lisbon on Monday for Oslo and arrived early.\n",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Ünïcödé ✓ 日本語 🙂 — «quotes» 0123456789",
    "",
]


def test_tokenizer_loads_offline_and_round_trips(default_ckpt: tuple[Path, dict], offline: None) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out, _ = default_ckpt
    cfg = ck.model_config()
    # AutoTokenizer (reads config.json's model_type first) as workload.load_tokenizer calls it, and
    # PreTrainedTokenizerFast, which reads only the tokenizer files.
    for tok in (
        AutoTokenizer.from_pretrained(str(out), local_files_only=True),
        PreTrainedTokenizerFast.from_pretrained(str(out), local_files_only=True),
    ):
        assert len(tok) == cfg["vocab_size"]
        assert (tok.bos_token_id, tok.eos_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"])
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            assert all(0 <= i < cfg["vocab_size"] for i in ids)
            assert tok.decode(ids) == text
        with_bos = tok.encode("hi there")
        assert with_bos[0] == 0 and tok.decode(with_bos, skip_special_tokens=True) == "hi there"
        assert len(tok.encode(TEXTS[0], add_special_tokens=False)) < len(TEXTS[0]) * 0.7  # merges work
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<s>")


def test_workload_prompts_fit_the_vocabulary(default_ckpt: tuple[Path, dict], offline: None) -> None:
    from kit.backends.sglang.workload import load_tokenizer, prompt_ids

    out, _ = default_ckpt
    tok = load_tokenizer(out)
    ids = prompt_ids(tok, 4096, prompt_id=0)
    assert len(ids) == 4096 and ids[0] == 0 and max(ids) < ck.model_config()["vocab_size"]


def test_config_parses_as_the_deepseek_v3_schema(default_ckpt: tuple[Path, dict], offline: None) -> None:
    """What sglang 0.5.14's HfModelConfigParser gets from AutoConfig: DeepseekV3Config with the DSA fields."""
    from transformers import AutoConfig, DeepseekV3Config

    out, _ = default_ckpt
    cfg = AutoConfig.from_pretrained(str(out), local_files_only=True)
    assert type(cfg) is DeepseekV3Config
    rope = cfg.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 128 and rope["rope_theta"] == 10000
    assert rope["original_max_position_embeddings"] * rope["factor"] == cfg.max_position_embeddings
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim) == (2048, 64, 128)
    assert cfg.index_share_for_mtp_iteration is True and cfg.num_nextn_predict_layers == 1
    assert (cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (16, 512, 64)
    assert cfg.moe_layer_freq == 1 and cfg.topk_method == "noaux_tc" and cfg.scoring_func == "sigmoid"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
