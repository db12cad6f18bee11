"""Every sglang release the kit knows, in one table: its wheel, what `kit verify` finds in it, which probe
targets fit it, how to install it, and the indexer kernels its GPU path launches.

The one place that knows a release (stdlib only: the probe inside sglang's interpreter may read it). States
and carriers were read from the PyPI wheels by `kit verify`; tests re-derive them from the pinned wheels.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.errors import UsageError

BASELINE = "0.5.14"  # the newest buggy release: the `bug` arm
LOCAL_LABEL = "pr29654"  # the kit's patched build is BASELINE + "+" + LOCAL_LABEL
PATCHED = f"{BASELINE}+{LOCAL_LABEL}"
PR_CARRIER = "EagleDraftInput.mtp_topk_indices"  # the PR's (and the kit patch's) naming
UPSTREAM = "0.5.15"  # the first release with the fix upstream (renamed carrier): the `upstream` arm
PR_REF = "sgl-project/sglang PR #29654"
PR_COMMIT = "45314a9fcb1b70a764f7d1f6c4238560fc524a25"  # the PR's merge commit; its parent is the bug


@dataclass(frozen=True)
class Release:
    version: str
    wheel: str | None  # PyPI filename (cp312, manylinux x86_64); None for the kit's own build
    sha256: str | None
    state: str  # absent | bug | fix, as `kit verify` reads the source
    carrier: str | None  # where the shared top-k lives
    probe_targets: str | None  # key of the probe-target set that fits (kit.probe.targets); None: not probed
    torch: str | None = None  # the torch version its wheel pins


def _wheel(version: str) -> str:
    return f"sglang-{version}-cp312-cp312-manylinux_2_34_x86_64.whl"


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            "0.5.12.post1",
            _wheel("0.5.12.post1"),
            "fb53554bcb592c26b94f609745620e1b1fa5e9fb4650de4bc3a8373542dacd4d",
            "absent",
            None,
            None,
        ),
        Release(  # the fields exist, nothing switches the gate on
            "0.5.13",
            _wheel("0.5.13"),
            "2c32b23dade35e3e5038ed200580a692ab378e1c232ad690d893c6cfce95c1e8",
            "absent",
            "ForwardBatch.topk_indices",
            None,
        ),
        Release(
            "0.5.13.post1",
            _wheel("0.5.13.post1"),
            "55a8f3a54cfb56d562ca5b3e77678d28a1ecb97eb89fc9f673c2fc3e33f2d544",
            "bug",
            "ForwardBatch.topk_indices",
            None,
        ),
        Release(
            "0.5.14",
            _wheel("0.5.14"),
            "4573aac774045ba926bab2f7efaaad7b120e4f84695ccf27c59d276f856deca8",
            "bug",
            "ForwardBatch.topk_indices",
            "0.5.14",
            torch="2.11.0",
        ),
        Release(PATCHED, None, None, "fix", PR_CARRIER, "0.5.14", torch="2.11.0"),
        Release(
            "0.5.15",
            _wheel("0.5.15"),
            "b737df527bbba96fe098a02d182e98f72a1b3564d7fc754629041129a5d8edc1",
            "fix",
            "EagleDraftInput.dsa_topk_indices",
            "0.5.14",
            torch="2.11.0",
        ),
        Release(
            "0.5.16",
            _wheel("0.5.16"),
            "b8ed16e72c7d6a643e31ba52e3ff106439e9dbb78543950e4c810158b826ea8e",
            "fix",
            "EagleDraftInput.dsa_topk_indices",
            "0.5.14",
            torch="2.11.0",
        ),
        Release(
            "0.5.17",
            _wheel("0.5.17"),
            "fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093",
            "fix",
            "EagleDraftInput.dsa_topk_indices",
            "0.5.17",
            torch="2.11.0",
        ),
        Release(
            "0.5.21",
            _wheel("0.5.21"),
            "ac300998eb6b1afcb2971b31317b66ef12891003bdf9d1a5c7e34f9d4e3dcf0d",
            "fix",
            "IndexTopKShareState",
            "0.5.21",
            torch="2.13.0",
        ),
        Release(
            "0.5.23",
            _wheel("0.5.23"),
            "8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",
            "fix",
            "IndexTopKShareState",
            "0.5.21",
            torch="2.14.1",
        ),
    )
}


def release(version: str) -> Release:
    try:
        return RELEASES[version]
    except KeyError:
        raise UsageError(
            f"sglang {version!r} is not in the kit's release registry (kit/sglang_src/releases.py); "
            f"known: {', '.join(RELEASES)}",
            param="version",
        ) from None


def pinned(version: str) -> tuple[str, str]:
    """(wheel filename, sha256) of a release PyPI serves."""
    r = release(version)
    if r.wheel is None or r.sha256 is None:
        raise UsageError(f"sglang {version} is the kit's own build, not a PyPI wheel: make it with kit build")
    return r.wheel, r.sha256


def probed_releases() -> list[str]:
    """Releases whose probe targets the kit has checked against their source."""
    return [v for v, r in RELEASES.items() if r.probe_targets]


def lookup(version: str) -> Release | None:
    """The registry's row for an installed version: exact first, then its public part (a local build such
    as 0.5.16+mine probes like 0.5.16; the AST check still runs on it). None: a release the kit does not
    know."""
    return RELEASES.get(version) or RELEASES.get(version.split("+", 1)[0])


def probe_set(version: str) -> str | None:
    """Key of the probe-target set (kit.probe.targets.TARGET_SETS) a version uses; None when the registry
    does not know the version or has not checked its targets."""
    r = lookup(version)
    return r.probe_targets if r is not None else None


def install_hint(arm: str, built_wheel: str | None = None) -> str:
    """The one pip line that puts the build an arm needs in place."""
    pip = "pip install --no-deps --force-reinstall"
    if arm == "bug":
        return f"{pip} sglang=={BASELINE}"
    if arm == "upstream":
        return f"{pip} sglang=={UPSTREAM}"
    return f"{pip} {built_wheel or f'build/sglang-{PATCHED}/sglang-{PATCHED}-*.whl (make it: kit build)'}"


# The DSA indexer's GPU kernels (sglang 0.5.14 on sm90: deep_gemm, sgl_kernel, sglang's jit kernels), matched
# as case-insensitive substrings of a kernel's shortName or demangledName. A leading '=' means the whole
# shortName: sgl_kernel's FastTopK is `topk_kernel`, while the MoE router's `deepseek_v3_topk_kernel` (in
# every MoE layer) contains the same substring.
INDEXER_KERNELS = (
    "paged_mqa_logits_metadata",
    "fp8_paged_mqa_logits",
    "fp8_mqa_logits",
    "topk_transform",
    "=topk_kernel",
    "act_quant",
    "hadamard",
    "fused_store_index",  # fused_store_index_k_cache; sglang 0.5.14 on H200: fused_store_indexer_cache
)
# One kernel per indexer call, whatever interleaves with it: the logits kernel (decode: paged; extend:
# ragged). Neither matches the other, nor the metadata kernel (`smxx_paged_mqa_logits_metadata`).
INDEXER_ANCHORS = ("fp8_paged_mqa_logits", "fp8_mqa_logits")
# One kernel per model forward: the token-embedding lookup (torch index_select; Small/Large by batch).
FORWARD_KERNELS = ("indexSelectSmallIndex", "indexSelectLargeIndex")

# The indexer's kernels on each GPU architecture, as the binaries that launch them name them, read from the
# wheels sglang 0.5.14 pins (tests re-read them): deep_gemm 0.1.3 JIT-compiles the logits kernels from its
# `impls/sm{90,100}_fp8_*mqa_logits.cuh` (the metadata kernel is arch-neutral), and sglang_kernel 0.4.4
# ships one build of its top-k kernels per arch, `sgl_kernel/sm90/` loaded on compute capability 9.0 and
# `sgl_kernel/sm100/` on any other (B200 is sm100, B300 sm103). The act_quant (Triton), Hadamard and
# index-cache store kernels are compiled on the host from sglang's own sources: one name on every arch.
# INDEXER_KERNELS above matches every name here (a test holds it to that), so the classifier needs no arch.
INDEXER_KERNEL_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "sm90": {
        "deep_gemm": ("sm90_fp8_paged_mqa_logits", "sm90_fp8_mqa_logits", "smxx_paged_mqa_logits_metadata"),
        "sgl_kernel": (
            "topk_kernel",
            "topk_transform_decode_kernel",
            "topk_transform_prefill_kernel",
            "topk_transform_prefill_ragged_kernel",
        ),
    },
    "sm100": {
        "deep_gemm": ("sm100_fp8_paged_mqa_logits", "sm100_fp8_mqa_logits", "smxx_paged_mqa_logits_metadata"),
        "sgl_kernel": (
            "topk_kernel",
            "topk_transform_decode_kernel",
            "topk_transform_prefill_kernel",
            "topk_transform_prefill_ragged_kernel",
        ),
    },
}
INDEXER_KERNELS_ANY_ARCH = (
    "_act_quant_kernel",
    "fast_hadamard_transform_kernel",
    "fused_store_indexer_cache",
)


def gpu_arch(major: int, minor: int = 0) -> str:
    """The kernel table a compute capability uses: sgl_kernel's rule (9.0: sm90, anything else: sm100)."""
    return "sm90" if (major, minor) == (9, 0) else "sm100"


def indexer_kernel_names(arch: str) -> tuple[str, ...]:
    """Every indexer kernel name on one arch (INDEXER_KERNEL_NAMES plus the arch-neutral ones)."""
    try:
        table = INDEXER_KERNEL_NAMES[arch]
    except KeyError:
        known = ", ".join(INDEXER_KERNEL_NAMES)
        raise UsageError(f"no indexer kernel table for {arch!r}: use one of {known}", param="arch") from None
    return tuple(n for names in table.values() for n in names) + INDEXER_KERNELS_ANY_ARCH
