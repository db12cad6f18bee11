"""Smoke test for a staged sglang install on a GPU host: `python -m kit.sglang_src.stage_smoke` with
PYTHONPATH set to the staged folders. Imports what the DSA + EAGLE server path loads and launches one kernel
from each compiled package, so a missing or mis-trimmed wheel shows up in seconds rather than mid-profile.
Prints one JSON object; exit status 1 if anything failed.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback

MODULES = (
    "sglang",
    "sglang.srt.server_args",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.models.deepseek_v2",
    "sglang.srt.models.deepseek_nextn",
    "sglang.srt.layers.attention.dsa_backend",
    "sglang.srt.layers.attention.dsa.dsa_indexer",
    "sglang.srt.speculative.eagle_worker_v2",
    "sgl_kernel",
    "sgl_kernel.flash_mla",
    "deep_gemm",
    "flashinfer",
    "tvm_ffi",
    "transformers",
)


def _kernels() -> dict:
    import sgl_kernel
    import torch

    x = torch.randn(1, 8192, device="cuda")
    lens = torch.full((1,), 8192, dtype=torch.int32, device="cuda")
    idx = sgl_kernel.fast_topk_v2(x, lens, 2048)
    ref = set(torch.topk(x, 2048, dim=-1).indices[0].tolist())
    overlap = len(ref & set(idx[0].tolist())) / 2048
    import deep_gemm

    meta = deep_gemm.get_paged_mqa_logits_metadata(
        torch.full((1, 1), 8192, dtype=torch.int32, device="cuda"), 64, deep_gemm.get_num_sms()
    )
    torch.cuda.synchronize()
    return {"fast_topk_v2_overlap": overlap, "paged_mqa_metadata_shape": list(meta.shape)}


def main() -> int:
    out: dict = {"python": sys.version.split()[0], "modules": {}, "ok": True}
    for name in MODULES:
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(name)
            out["modules"][name] = {
                "ok": True,
                "s": round(time.perf_counter() - t0, 2),
                "version": getattr(mod, "__version__", None),
                "file": getattr(mod, "__file__", None),
            }
        except Exception as e:  # report every failure, not just the first
            out["ok"] = False
            out["modules"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    try:
        out["kernels"] = _kernels()
    except Exception as e:
        out["ok"] = False
        out["kernels"] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
