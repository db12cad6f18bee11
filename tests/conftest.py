"""Shared test set-up. Nsight-backed tests must not be skipped in CI (CI=true)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/*_helpers.py modules, beside this file


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, a suite that skipped Nsight tests or collected nothing has not tested the kit."""
    if os.environ.get("CI", "").lower() != "true":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        names = ", ".join(r.nodeid for r in skipped)
        print(f"\nCI: {len(skipped)} skipped ({names}); every test must run in CI", file=sys.stderr)
        session.exitstatus = 1
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = 1


@pytest.fixture(scope="session")
def require_nsys() -> str:
    """The nsys binary; outside CI a missing nsys skips, in CI it fails (Nsight tests must run there)."""
    from kit.trace.nsys import find_nsys

    nsys = find_nsys()
    if nsys is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("nsys not found in CI: .ci/run must install Nsight Systems (scripts/ensure-nsys.sh)")
        pytest.skip("nsys not installed (run `make nsys`)")
    return nsys
