"""The shared pytest plugin: ``--shard`` splits a suite into disjoint parts that cover it."""

from __future__ import annotations

import pytest

from ads_kernel_tools.pytest_plugin import shard_of

SUITE = """
import pytest

@pytest.mark.parametrize("i", range(7))
def test_n(i):
    print(f"ran-{i}")
"""


def test_shard_parse():
    assert shard_of("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "x/2", "3"):
        with pytest.raises(pytest.UsageError):
            shard_of(bad)


def test_shards_are_disjoint_and_cover_the_suite(pytester):
    pytester.makeconftest('pytest_plugins = ["ads_kernel_tools.pytest_plugin"]')
    pytester.makepyfile(SUITE)
    seen = []
    for i in range(3):
        result = pytester.runpytest("-s", "-p", "no:cacheprovider", "--shard", f"{i}/3")
        counts = result.parseoutcomes()
        assert counts.get("deselected", 0) == 7 - counts["passed"]
        seen += [int(line.split("-")[1][0]) for line in result.outlines if "ran-" in line]
    assert sorted(seen) == list(range(7))
