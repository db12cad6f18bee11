"""The arms of every experiment, in one table: what each one runs and what it must show."""

from __future__ import annotations

from kit.errors import UsageError

# off: sharing switched off (every draft step runs the indexer); bug: sglang 0.5.14 as released;
# fix: 0.5.14 + the kit's PR #29654 patch; upstream: a later release that fixed it (renamed carrier).
ARMS = ("off", "bug", "fix", "upstream")
FIX_ARMS = ("fix", "upstream")
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
