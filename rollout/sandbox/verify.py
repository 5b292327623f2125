"""Verifier helpers for code tasks: run a task's tests inside the session's sandbox, where the agent left its
changes, and score them. The tests run with the sandbox's isolation and limits, so whatever the agent wrote cannot
reach the host while being tested."""

from __future__ import annotations

import shutil
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.rollout.sandbox.sandbox import Sandbox

REPORT = ".forge-test-report.xml"


@dataclass(frozen=True)
class PytestReport:
    passed: int
    failed: int                 # failures and errors
    output: str                 # the end of pytest's output

    @property
    def total(self) -> int:
        return self.passed + self.failed

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


def session_sandbox(session: Mapping[str, Any] | str | Path) -> Sandbox:
    """The sandbox of a session record as the verifier gets it (``session['sandbox']``), or of a directory."""
    where = session.get("sandbox") if isinstance(session, Mapping) else session
    if not where:
        raise ValueError("this session has no sandbox: set [sandbox] enabled = true in the run file")
    return Sandbox.attach(where)


TEST_FILES = ("test_*.py", "*_test.py", "conftest.py")


def restore_tests(source: Path, workspace: Path) -> None:
    """Copy ``source``'s test files to the same places in ``workspace`` (replacing what is there)."""
    for pattern in TEST_FILES:
        for found in source.rglob(pattern):
            target = workspace / found.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)          # a link the agent left there is replaced, not followed
            shutil.copyfile(found, target)


def run_pytest(session: Mapping[str, Any] | str | Path, *paths: str, restore: str | Path | None = None,
               timeout_s: float | None = None) -> PytestReport:
    """Run pytest on ``paths`` (default: the workspace) in the session's sandbox, with the Python Forge runs in.
    ``restore``: a host folder whose test files (``test_*.py``, ``*_test.py``, ``conftest.py``, in any subfolder)
    are copied over the workspace first: the task's own tests, so that what is graded is not what the agent may
    have edited. The counts come from pytest's JUnit report, not from output the tests print; a
    run that collects nothing counts as one failure."""
    sandbox = session_sandbox(session)
    if restore is not None:
        restore_tests(Path(restore), sandbox.workspace)
    report = sandbox.workspace / REPORT
    report.unlink(missing_ok=True)
    result = sandbox.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={REPORT}",
                          *(paths or (".",))], timeout_s=timeout_s)
    output = (result.stdout + result.stderr)[-4000:]
    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return PytestReport(0, 1, output)
    finally:
        report.unlink(missing_ok=True)
    tests = failed = 0
    for suite in root.iter("testsuite"):
        tests += int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return PytestReport(max(0, tests - failed), failed if tests else 1, output)


def tests_pass_rate(session: Mapping[str, Any] | str | Path, *paths: str, restore: str | Path | None = None,
                    timeout_s: float | None = None) -> float:
    """The share of the task's tests that pass in the session's sandbox: a verifier's reward for a code task."""
    return run_pytest(session, *paths, restore=restore, timeout_s=timeout_s).pass_rate


__all__ = ["REPORT", "TEST_FILES", "PytestReport", "restore_tests", "run_pytest", "session_sandbox", "tests_pass_rate"]
