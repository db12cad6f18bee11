"""Measure what `kit stage pack` would send an offline GPU host for an sglang release, and write its lock.

    python scripts/stage_closure.py resolve VERSION [--exclude NAME ...]   # pip's closure (network)
    python scripts/stage_closure.py measure VERSION [VERSION ...]          # sizes and 45 MiB parts
    python scripts/stage_closure.py lock VERSION --out data/stage/sglang-VERSION-h200.json

`resolve` asks pip for the full wheel closure of sglang==VERSION for the host (cp312, manylinux x86_64), as a
dry-run report; `--exclude` resolves sglang's own requirements without a pin PyPI cannot serve as a wheel
(sglang 0.5.21 pins cuda-tile==1.6.0rc5, published only as an sdist).

The host image is modelled from the committed 0.5.14 lock (data/stage/sglang-0.5.14-h200.json): every
package of 0.5.14's closure that lock does not list is one the image has, at the version pinned for it there
(exact pins: torch 2.11.0 and the CUDA libraries it pins), at a version the image is known to carry
(IMAGE_VERSIONS), or else at the version pip resolved for 0.5.14. A package of the release's closure is
served by the image when that version satisfies every requirement on it in the closure and its own
requirements still hold once the staged wheels are in place (torchvision 0.26 needs torch 2.11.0);
everything else is staged. Drops, trims and fallbacks carry over from the 0.5.14 lock by package name, plus
NEW_DROPS for packages 0.5.14 did not need. `measure` downloads every staged
wheel from the URL pip resolved (sha256-checked), trims it as `kit stage pack` does, and counts the tar
payload's 45 MiB parts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's kit first on sys.path)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kit.paths import REPO
from kit.sglang_src.stage import DEFAULT_PART_MIB, trim_wheel

BASE_LOCK = REPO / "data" / "stage" / "sglang-0.5.14-h200.json"
WORK = REPO / ".cache" / "closure"  # pip reports and downloaded wheels (git-ignored)
# What the H200 image was seen to carry (its pip list), where 0.5.14's closure pins nothing.
IMAGE_VERSIONS = {
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torchaudio": "2.11.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
# Packages 0.5.14's closure did not have that the sm90 DSA + EAGLE path does not load, with why (read from
# sglang 0.5.16's code; the host's install step imports the server's modules and launches the indexer's
# kernels, which is the check).
NEW_DROPS = {
    "nvidia-cutlass-dsl-libs-core": (
        "CuTe DSL runtime: imported only by Blackwell (tcgen05) and diffusion kernels"
    ),
    "nvidia-cutlass-dsl-libs-cu12": "CuTe DSL runtime (CUDA 12 build): the host runs CUDA 13",
    "nvidia-cuda-nvdisasm": "needed only by the CuTe DSL runtimes, which are not staged",
    "nvidia-cuda-cccl": "CCCL headers for humming's JIT kernels (humming quantization only); the image's "
    "CUDA 13 toolkit has them",
    "numba": "imported only by the Inkling image processor; sglang's processor registry skips it on a "
    "failed import, and a text model never uses it",
    "llvmlite": "numba's compiler back end (numba is not staged)",
    "cuda-tile": "cuTile kernels; not on the DSA path",
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
TAR_BLOCK = 512


@dataclass
class Pkg:
    name: str
    version: str
    file: str
    url: str
    sha256: str
    requires: list[str]
    extras: list[str] = field(default_factory=list)


def load_report(path: Path) -> dict[str, Pkg]:
    """pip's --report JSON -> {canonical name: Pkg}. A resolution of a requirements file gets a pseudo
    `sglang` requirer (its lines), so the release's own pins count like any other requirement."""
    if not Path(path).is_file():
        version = Path(path).stem.removeprefix("r-")
        print(
            f"{path}: no closure of sglang {version} yet: run `stage_closure.py resolve {version}`",
            file=sys.stderr,
        )
        raise SystemExit(2)
    data = json.loads(Path(path).read_text())
    out: dict[str, Pkg] = {}
    for item in data["install"]:
        meta = item["metadata"]
        info = item["download_info"]
        out[canonicalize_name(meta["name"])] = Pkg(
            canonicalize_name(meta["name"]),
            meta["version"],
            info["url"].rsplit("/", 1)[1],
            info["url"],
            info["archive_info"]["hashes"]["sha256"],
            list(meta.get("requires_dist") or []),
            list(item.get("requested_extras") or []),
        )
    if "sglang" not in out and data.get("kit_requirements"):
        from kit.sglang_src.releases import pinned

        wheel, sha = pinned(data["kit_version"])
        out["sglang"] = Pkg("sglang", data["kit_version"], wheel, "", sha, data["kit_requirements"])
    return out


def _applies(req: Requirement, extras: list[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKERS, "extra": e}) for e in (extras or [""]))


def requirements_on(closure: dict[str, Pkg]) -> dict[str, list[tuple[str, Requirement]]]:
    """Every requirement of the closure, by the name it asks for: [(requirer, requirement)]."""
    out: dict[str, list[tuple[str, Requirement]]] = {}
    for pkg in closure.values():
        for line in pkg.requires:
            req = Requirement(line)
            if _applies(req, pkg.extras):
                out.setdefault(canonicalize_name(req.name), []).append((pkg.name, req))
    return out


def image_model(base: dict[str, Pkg], base_lock: dict) -> dict[str, Pkg]:
    """The image's packages and versions (module docstring): 0.5.14's closure minus its lock."""
    locked = {canonicalize_name(re.split(r"-\d", w["file"], maxsplit=1)[0]) for w in base_lock["wheels"]}
    reqs = requirements_on(base)
    image: dict[str, Pkg] = {}
    for name, pkg in base.items():
        if name in locked:
            continue
        pins = {
            s.version
            for _, r in reqs.get(name, [])
            for s in r.specifier
            if s.operator == "==" and "*" not in s.version
        }
        version = next(iter(pins)) if len(pins) == 1 else IMAGE_VERSIONS.get(name, pkg.version)
        requires = pkg.requires if version == pkg.version else []  # metadata known only for that version
        image[name] = Pkg(name, version, "", "", "", requires, pkg.extras)
    return image


def classify(closure: dict[str, Pkg], image: dict[str, Pkg]) -> dict[str, str]:
    """{name: 'image' | 'stage: why'} for every package of a release's closure."""
    reqs = requirements_on(closure)
    status: dict[str, str] = {}
    for name in closure:
        img = image.get(name)
        if img is None:
            status[name] = "stage: not in the image"
            continue
        bad = [
            f"{who} wants {r.specifier}"
            for who, r in reqs.get(name, [])
            if not r.specifier.contains(img.version, prereleases=True)
        ]
        status[name] = f"stage: the image has {img.version}; {'; '.join(bad)}" if bad else "image"
    changed = True
    while changed:  # an image package whose own requirements the staged wheels break is staged too
        changed = False
        env = {n: (image[n].version if s == "image" else closure[n].version) for n, s in status.items()}
        for name, s in status.items():
            if s != "image":
                continue
            for line in image[name].requires:
                req = Requirement(line)
                dep = canonicalize_name(req.name)
                if dep not in env or not _applies(req, image[name].extras):
                    continue
                if not req.specifier.contains(env[dep], prereleases=True):
                    status[name] = (
                        f"stage: the image's {name} {image[name].version} needs {dep}{req.specifier}, "
                        f"staged {env[dep]}"
                    )
                    changed = True
                    break
    return status


def rules(base_lock: dict) -> dict[str, dict]:
    """Drop / trim / fallback by package name, from the 0.5.14 lock and NEW_DROPS."""
    out = {canonicalize_name(k): {"drop": v} for k, v in NEW_DROPS.items()}
    for w in base_lock["wheels"]:
        name = canonicalize_name(re.split(r"-\d", w["file"], maxsplit=1)[0])
        out[name] = {k: w[k] for k in ("drop", "trim", "fallback") if k in w}
    return out


def lock_rows(closure: dict[str, Pkg], status: dict[str, str], base_lock: dict) -> list[dict]:
    """The staged wheels as lock rows (the 0.5.14 lock's format), fallbacks last."""
    rule = rules(base_lock)
    rows = []
    for name in sorted(closure, key=lambda n: closure[n].file.lower()):
        if status[name] == "image" or not closure[name].file:
            continue
        p = closure[name]
        rows.append({"file": p.file, "sha256": p.sha256, "url": p.url, **rule.get(name, {})})
    return [r for r in rows if "fallback" not in r] + [r for r in rows if "fallback" in r]


def download(row: dict, cache: Path) -> Path:
    """The wheel pip resolved, sha256-checked, kept in `cache` (kit's own pinned PyPI fetch)."""
    from kit.sglang_src.wheels import fetch_file, fetch_wheel

    if not row["url"]:  # the release itself, when pip resolved its requirements only: the pinned wheel
        return fetch_wheel(row["file"].split("-")[1])
    return fetch_file(row["file"], row["sha256"], cache)


def tar_bytes(sizes: list[int], names: list[str]) -> int:
    """The PAX tar `kit stage pack` writes: a header block per member (two when the name needs a PAX
    record), the data padded to 512 bytes, two zero blocks, the whole padded to tarfile's 20-block record."""
    n = 2 * TAR_BLOCK
    for size, name in zip(sizes, names, strict=True):
        n += TAR_BLOCK * (3 if len(name) > 100 else 1) + math.ceil(size / TAR_BLOCK) * TAR_BLOCK
    record = 20 * TAR_BLOCK
    return math.ceil(n / record) * record


def measure(version: str, work: Path, base_lock: dict, part_mib: int = DEFAULT_PART_MIB) -> dict:
    """What `kit stage pack` would send for sglang==version (module docstring)."""
    base = load_report(work / "r-0.5.14.json")
    closure = load_report(work / f"r-{version}.json")
    status = classify(closure, image_model(base, base_lock))
    rows = lock_rows(closure, status, base_lock)
    cache = work / "wheels"
    staged, names, trimmed, dropped = [], [], {}, []
    with tempfile.TemporaryDirectory(prefix="kit-closure-") as tmp:
        for row in rows:
            whl = download(row, cache)
            row["size"] = whl.stat().st_size
            if "drop" in row:
                dropped.append(row["size"])
                continue
            size = row["size"]
            if row.get("trim"):
                out = Path(tmp) / whl.name
                trim_wheel(whl, out, row["trim"])
                trimmed[whl.name] = {"before": size, "after": out.stat().st_size}
                size = out.stat().st_size
                out.unlink()
            staged.append(size)
            names.append(whl.name)
    payload = tar_bytes(staged, names)
    image = sorted(n for n, s in status.items() if s == "image")
    return {
        "version": version,
        "torch": closure["torch"].version if "torch" in closure else None,
        "closure": {"wheels": len(closure), "image_served": len(image)},
        "lock": {"wheels": len(rows), "bytes": sum(r["size"] for r in rows)},
        "dropped": {"wheels": len(dropped), "bytes": sum(dropped)},
        "staged": {"wheels": len(staged), "bytes": sum(staged)},
        "trimmed": trimmed,
        "payload_bytes": payload,
        "parts": math.ceil(payload / (part_mib << 20)),
        "part_mib": part_mib,
        "staged_because": {n: s for n, s in status.items() if s.startswith("stage: the image")},
        "rows": rows,
    }


def resolve(version: str, work: Path, exclude: list[str]) -> Path:
    """pip's dry-run closure of sglang==version for the host: r-VERSION.json under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    report = work / f"r-{version}.json"
    target = ["sglang==" + version]
    reqs: list[str] = []
    if exclude:
        from kit.sglang_src.wheelfile import wheel_metadata
        from kit.sglang_src.wheels import fetch_wheel

        drop = {canonicalize_name(x) for x in exclude}
        for req in wheel_metadata(fetch_wheel(version)).get_all("Requires-Dist") or []:
            if "extra ==" not in req and canonicalize_name(Requirement(req).name) not in drop:
                reqs.append(req)
        (work / f"req-{version}.txt").write_text("\n".join(reqs) + "\n")
        target = ["-r", str(work / f"req-{version}.txt")]
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--report", str(report), "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)]
    cmd += ["--target", str(work / f"t-{version}"), *target]
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_CONSTRAINT": ""})
    if reqs:  # the release's own pins, as the requirer they are
        data = json.loads(report.read_text())
        data.update(kit_version=version, kit_requirements=reqs, kit_excluded=exclude)
        report.write_text(json.dumps(data))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=WORK, help="reports and downloaded wheels")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resolve")
    r.add_argument("version")
    r.add_argument("--exclude", action="append", default=[], help="a requirement pip cannot serve as a wheel")
    m = sub.add_parser("measure")
    m.add_argument("versions", nargs="+")
    m.add_argument("--out", type=Path, help="write the table (JSON) here")
    lk = sub.add_parser("lock")
    lk.add_argument("version")
    lk.add_argument("--out", type=Path, required=True)
    lk.add_argument("--about", required=True, help="the lock's 'about' line")
    a = ap.parse_args(argv)
    base_lock = json.loads(BASE_LOCK.read_text())
    if a.cmd == "resolve":
        print(resolve(a.version, a.work, a.exclude))
    elif a.cmd == "measure":
        table = [{k: v for k, v in measure(v, a.work, base_lock).items() if k != "rows"} for v in a.versions]
        text = json.dumps(table, indent=1)
        if a.out:
            a.out.write_text(text + "\n")
        print(text)
    else:
        res = measure(a.version, a.work, base_lock)
        rows = [{k: v for k, v in r.items() if k != "url"} for r in res["rows"]]
        lock = {"about": a.about, "python": "3.12", "wheels": rows}
        a.out.write_text(json.dumps(lock, indent=1) + "\n")
        print(json.dumps({k: v for k, v in res.items() if k not in ("rows", "staged_because")}, indent=1))
    return 0


if __name__ == "__main__":
    from kit.errors import KitError

    try:
        sys.exit(main())
    except KitError as exc:  # a download that fails its sha256, a network error: one line
        print(f"stage_closure: error: {exc}", file=sys.stderr)
        sys.exit(2)
