"""The arms of every experiment, in one table: what each one runs and what it must show."""

from __future__ import annotations

from kit.errors import UsageError

# off: sharing switched off (every draft step runs the indexer); bug: sglang 0.5.14 as released;
# fix: 0.5.14 + the kit's PR #29654 patch; upstream: a later release that fixed it (renamed carrier).
ARMS = ("off", "bug", "fix", "upstream")
FIX_ARMS = ("fix", "upstream")
# Arms whose verdict says something only while sglang shares the indexer's top-k across draft steps: bug
# (num_steps - 1 launches because the share is lost) and fix/upstream (1 because it is kept). With sharing
# off every arm recomputes the top-k each step: bug passes whatever the build, and a fix "fails" falsely.
SHARING_ARMS = ("bug", "fix", "upstream")
# sglang 0.5.14's own condition for sharing (speculative/eagle_worker_v2.py, EagleDraftWorker.__init__).
SHARING_RULE = (
    "sglang shares the indexer's top-k across draft steps only when speculative_eagle_topk == 1 "
    '(EagleDraftWorker: index_share_for_mtp_iteration = getattr(hf_config, "index_share_for_mtp_iteration", '
    "False) and self.topk == 1)"
)


def check_eagle_topk(arm: str, eagle_topk: object) -> None:
    """Refuse an EAGLE topk other than 1 for an arm whose verdict depends on sharing: sharing is off
    there, so a pass would prove nothing and a fix arm's FAIL would be false; `off` never shares."""
    if eagle_topk != 1 and arm in SHARING_ARMS:
        raise UsageError(
            f"eagle_topk={eagle_topk!r} with arm {arm}: {SHARING_RULE}; with topk {eagle_topk!r} no arm "
            f"shares it, so arm {arm}'s launch count cannot show the bug or the fix: use eagle_topk 1 "
            "(the PR's 5/1/6), or arm off",
            param="eagle_topk",
        )


# The state `kit verify` must report for the build an arm runs on (None: any; off switches the feature off).
EXPECTED_STATE: dict[str, str | None] = {"bug": "bug", "fix": "fix", "upstream": "fix", "off": None}


def check_arm(arm: object) -> str:
    if arm not in ARMS:
        raise UsageError(f"unknown arm {arm!r}: use one of {', '.join(ARMS)}", param="arm")
    return str(arm)


def expected_per_round(arm: str, num_steps: int, backend: str = "mini") -> int:
    """off/bug: the indexer runs in each of the num_steps - 1 draft forwards; fix/upstream: once.

    Real sglang 0.5.15+ (`upstream` on the sglang backend) seeds the draft loop's first step with the
    top-k computed by draft_extend, so its draft loop runs the indexer zero times per round.
    """
    check_arm(arm)
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 2:
        raise UsageError(
            f"num_steps must be an integer >= 2 (speculative_num_steps), got {num_steps!r}", param="num_steps"
        )
    if arm in ("off", "bug"):
        return num_steps - 1
    return 0 if (arm == "upstream" and backend == "sglang") else 1
