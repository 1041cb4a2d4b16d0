"""Suite-wide rule: in CI (CI=true) a skipped test is a failure, unless it is listed below with the
reason it may skip there. A green CI run then means every test ran, not that missing tools or a
broken install quietly turned tests into skips."""

from __future__ import annotations

import os

import pytest

# node id -> why CI may skip it. Keep this short; each entry is coverage CI does not have.
ALLOWED_CI_SKIPS: dict[str, str] = {}

_skipped: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped[report.nodeid] = reason


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI", "").lower() != "true":
        return
    refused = {node: why for node, why in _skipped.items() if node not in ALLOWED_CI_SKIPS}
    if refused:
        lines = "\n".join(f"  {node}: {why}" for node, why in sorted(refused.items()))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"CI=true: {len(refused)} test(s) skipped that must run:\n{lines}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
