"""Shared test set-up. Nsight-backed tests must not be skipped in CI (CI=true)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/*_helpers.py modules


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, a suite that skipped Nsight tests or collected nothing has not tested the kit."""
    if os.environ.get("CI", "").lower() != "true":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        print(f"\nCI: {len(skipped)} test(s) were skipped; every test must run in CI", file=sys.stderr)
        session.exitstatus = 1
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = 1
