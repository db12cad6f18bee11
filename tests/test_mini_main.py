"""`python -m kit.backends.mini RUN_DIR`: reads params.json, writes outputs.jsonl + engine.json, once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.backends.mini.__main__ import main
from kit.paths import REPO
from kit.probe import ranges as nr


@pytest.fixture(autouse=True)
def _sink_off():
    yield
    nr.configure("off")


def _run_dir(tmp_path: Path, params: dict) -> Path:
    (tmp_path / "params.json").write_text(json.dumps(params))
    return tmp_path


def test_bad_params_exit_2_with_one_line_and_write_nothing(tmp_path):
    d = _run_dir(tmp_path, {"num_steps": 1})
    proc = subprocess.run(
        [sys.executable, "-m", "kit.backends.mini", str(d)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "num_steps" in lines[0] and "2..16" in lines[0]
    assert sorted(p.name for p in d.iterdir()) == ["params.json"]


def test_missing_params_json(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "params.json" in capsys.readouterr().err


def test_run_writes_outputs_and_engine_and_refuses_to_overwrite(tmp_path, capsys):
    d = _run_dir(
        tmp_path,
        {
            "arm": "fix",
            "context_len": 1024,
            "num_requests": 3,
            "max_new_tokens": 10,
            "nvtx_sink": "off",
            "seed": 3,
        },
    )
    assert main([str(d)]) == 0
    rows = [json.loads(line) for line in (d / "outputs.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["input_len"] == 1024 and r["completion_tokens"] == len(r["output_ids"]) == 10
        assert r["accept_length"] == pytest.approx(10 / r["spec_verify_ct"])
        assert all(isinstance(t, int) for t in r["output_ids"])
        assert len(r["draft_ids"]) == r["spec_verify_ct"]
    engine = json.loads((d / "engine.json").read_text())
    assert engine["preset"]["name"] == "tiny" and engine["preset"]["index_n_heads"] == 16
    assert engine["device"] == "cpu" and engine["torch_version"]
    assert engine["draft_rounds"] == max(r["spec_verify_ct"] for r in rows)
    assert engine["draft_indexer_calls_per_round"] == [1] * engine["draft_rounds"]
    assert engine["topk_carrier"] == "spec_info.mtp_topk_indices"
    assert "cannot show the bug's cost" in engine["warnings"][0]  # 1024 <= index_topk
    assert "cannot show the bug's cost" in capsys.readouterr().err
    for key in ("prefill_s", "decode_s", "draft_step_ms_median", "max_cache_len", "prefill_method"):
        assert key in engine
    before = (d / "outputs.jsonl").read_text()
    assert main([str(d)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (d / "outputs.jsonl").read_text() == before


def test_same_seed_same_outputs_other_seed_other_outputs(tmp_path):
    outs = []
    for i, seed in enumerate((0, 0, 1)):
        d = tmp_path / str(i)
        d.mkdir()
        _run_dir(d, {"arm": "bug", "context_len": 512, "max_new_tokens": 8, "nvtx_sink": "off", "seed": seed})
        assert main([str(d)]) == 0
        outs.append((d / "outputs.jsonl").read_text())
    assert outs[0] == outs[1] != outs[2]
