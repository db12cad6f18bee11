"""Tell whether an sglang wheel, tree or install has PR #29654's bug, its fix, or neither, by reading source.

Nothing here imports sglang (a GPU-only package): files are parsed with `ast`. The verdict follows
the data flow the PR is about, not version strings. In the NextN (MTP draft) model's forward we find
where `prev_topk_indices` comes from and where the new top-k is written:
- an attribute of the ForwardBatch itself -> "bug": each draft step runs on a shallow copy of the
  ForwardBatch, so the write-back is lost;
- an attribute of `forward_batch.spec_info`, directly or through a state object that stores there
  (0.5.23's IndexTopKShareState) -> "fix": spec_info is shared by reference between the copies;
- no reuse at all, or a reuse gate that nothing in sglang/srt ever switches on -> "absent";
- anything else -> "unknown", with reasons.
"""

from __future__ import annotations

import re
from pathlib import Path

from kit.sglang_src.source import SglangSource, shown
from kit.sglang_src.topk_flow import Access, Analysis, is_carrier_attr

NEXTN = "srt/models/deepseek_nextn.py"
FEATURE_FLAG = "index_share_for_mtp_iteration"
_MAX_GATE_EVIDENCE = 3


def _carrier(an: Analysis, acc: Access) -> tuple[str, dict | None]:
    """The carrier's name (Class.field, or the state class) and the evidence of its declaration."""
    if acc.via:  # the state object is the carrier; its backing field is evidence
        return acc.via, _carrier(an, Access(acc.storage, acc.attr, acc.ev))[1]
    if acc.storage == "forward_batch":
        decl = an.field_decl(acc.attr or "", ["srt/model_executor/forward_batch_info.py"])
        return f"ForwardBatch.{acc.attr}", decl[1] if decl else None
    if acc.storage == "spec_info":
        rels = sorted(an.src.files("srt/speculative"), key=lambda r: not r.endswith("eagle_info.py"))
        decl = an.field_decl(acc.attr or "", rels)
        return (f"{decl[0]}.{acc.attr}", decl[1]) if decl else (f"spec_info.{acc.attr}", None)
    return f"{acc.storage}:{acc.attr}", None


def _result(state: str, version: str, carrier: str | None, evidence: list[dict], reasons: list[str]) -> dict:
    seen, ev = set(), []
    for e in evidence:
        key = (e["file"], e["line"])
        if key not in seen:
            seen.add(key)
            ev.append(e)
    return {"state": state, "version": version, "carrier": carrier, "evidence": ev, "reasons": reasons}


def _feature_mentions(src: SglangSource) -> list[dict]:
    """Lines of sglang/srt that name the feature flag or a reuse gate (the first in each file)."""
    out = []
    for rel in src.files("srt"):
        text = src.read(rel) or ""
        if FEATURE_FLAG in text or re.search(r"reuse_\w*topk_indices", text):
            n = next(i for i, ln in enumerate(text.split("\n"), 1) if FEATURE_FLAG in ln or "reuse_" in ln)
            out.append({"file": shown(rel), "line": n, "source": text.split("\n")[n - 1].strip()})
    return out


def _classify(an: Analysis, version: str) -> dict:
    reasons = an.reasons
    mod = an.module(NEXTN)
    if mod is None:
        if not any("does not parse" in r for r in reasons):
            reasons.append(f"{shown(NEXTN)} not found: no DeepSeek NextN (MTP draft) model to inspect")
        return _result("unknown", version, None, [], reasons)

    sites = an.reuse_sites(mod)
    if not sites:
        mentions = _feature_mentions(an.src)
        if mentions:
            reasons.append(
                f"{FEATURE_FLAG} / a reuse_*topk_indices gate appears in sglang/srt, but the NextN model "
                "passes no prev_topk_indices: layout not understood"
            )
            return _result("unknown", version, None, mentions[:5], reasons)
        reasons.append(
            "the NextN model passes no prev_topk_indices to its decoder layer and nothing in sglang/srt "
            f"mentions {FEATURE_FLAG}: the indexer runs on every draft step by design"
        )
        return _result("absent", version, None, [], reasons)

    reads: list[Access] = []
    writes: list[Access] = []
    quals = []
    evidence = []
    for qual, fn, kw in sites:
        quals.append(qual)
        evidence.append(mod.ev(kw.value))
        reads += an.resolve_read(fn, kw.value, kw.value.lineno)
        writes += an.writes_in(fn)
    where = ", ".join(sorted(set(quals)))
    evidence += [a.ev for a in reads] + an.calls + [a.ev for a in writes]

    if not reads:
        reasons.append(f"{where} passes prev_topk_indices=None: no reuse")
        return _result("absent", version, None, evidence, reasons)
    odd = [a for a in reads if a.storage not in ("forward_batch", "spec_info")]
    if odd:
        reasons.append(f"{where}: prev_topk_indices comes from {odd[0].attr!r}, which is not understood")
        return _result("unknown", version, None, evidence, reasons)
    read_keys = {(a.storage, a.attr) for a in reads}
    if len(read_keys) > 1:
        reasons.append(f"{where} reads prev_topk_indices from several places: {sorted(read_keys)}")
        return _result("unknown", version, None, evidence, reasons)
    read = reads[0]
    carrier, decl = _carrier(an, read)
    if decl:
        evidence.append(decl)
    storage_txt = (
        f"forward_batch.{read.attr}" if read.storage == "forward_batch" else f"spec_info.{read.attr}"
    )
    via_txt = f" (through {read.via})" if read.via else ""

    gates = sorted({a.gate for a in reads if a.gate})
    if gates:
        setters = [e for g in gates for e in an.gate_setters(g)]
        if not setters:
            reasons.append(
                f"{where} would reuse {storage_txt}{via_txt} when ForwardBatch.{gates[0]} is set, "
                "but nothing in sglang/srt sets it: index sharing can never switch on"
            )
            return _result("absent", version, carrier, evidence, reasons)
        evidence += setters[:_MAX_GATE_EVIDENCE]
    else:
        reasons.append(f"{where}: the read of {storage_txt} is not behind a reuse_*topk_indices gate")

    same = [w for w in writes if (w.storage, w.attr) == (read.storage, read.attr)]
    if not same:
        others = sorted({f"{w.storage}.{w.attr}" for w in writes if is_carrier_attr(w.attr or "")})
        reasons.append(
            f"{where} reads prev_topk_indices from {storage_txt}{via_txt} but never writes the new top-k "
            "there" + (f" (writes: {', '.join(others)})" if others else "")
        )
        return _result("unknown", version, carrier, evidence, reasons)
    if read.storage == "forward_batch":
        reasons.append(
            f"{where} reads prev_topk_indices from and writes the new top-k to {storage_txt}{via_txt}: an "
            "attribute of the per-step ForwardBatch copy, so the write-back is lost and every draft step "
            "re-runs the indexer (the bug fixed by PR #29654)"
        )
        return _result("bug", version, carrier, evidence, reasons)
    reasons.append(
        f"{where} reads prev_topk_indices from and writes the new top-k to forward_batch.{storage_txt}"
        f"{via_txt}: spec_info is shared by reference across the per-step ForwardBatch copies, so the "
        "first draft step's top-k reaches the later ones (fixed)"
    )
    return _result("fix", version, carrier, evidence, reasons)


def detect_state(path: Path | str) -> dict:
    """Classify an sglang .whl / unpacked tree / installed package; see the module docstring.

    Returns {state, version, carrier, evidence: [{file, line, source}], reasons}. Raises InputError only
    when the input cannot be read as sglang at all.
    """
    with SglangSource(path) as src:
        an = Analysis(src)
        version, note = src.version()
        if note:
            an.reasons.append(note)
        return _classify(an, version)
