"""``testing.assert_memcheck_clean`` with a stand-in compute-sanitizer on PATH that runs the command
and prints memcheck's summary line, so the pass/fail logic is tested without a GPU."""

from __future__ import annotations

import os

import pytest

from ads_kernel_tools.testing import assert_memcheck_clean

FAKE = """#!/bin/sh
[ "$1 $2 $3 $4 $5 $6" = "--tool memcheck --report-api-errors no --error-exitcode 3" ] || exit 9
shift 6
"$@"; rc=$?
echo "========= ERROR SUMMARY: ${ERRORS:-0} errors"
exit $rc
"""


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch):
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(FAKE)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


def _script(folder, body: str):
    path = folder / "case.py"
    path.write_text(body)
    return path


def test_passes_on_marker_and_zero_errors(fake_sanitizer):
    assert_memcheck_clean(_script(fake_sanitizer, "print('all ran')"), done_marker="all ran")


def test_fails_without_marker(fake_sanitizer):
    with pytest.raises(AssertionError):
        assert_memcheck_clean(_script(fake_sanitizer, "print('half')"), done_marker="all ran")


def test_fails_on_errors_or_exit_code(fake_sanitizer):
    with pytest.raises(AssertionError):
        assert_memcheck_clean(
            _script(fake_sanitizer, "print('all ran')"), done_marker="all ran", env={"ERRORS": "2"}
        )
    with pytest.raises(AssertionError):
        assert_memcheck_clean(
            _script(fake_sanitizer, "print('all ran'); raise SystemExit(1)"), done_marker="all ran"
        )


def test_skips_without_the_tool(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception):
        assert_memcheck_clean(tmp_path / "none.py", done_marker="x")
