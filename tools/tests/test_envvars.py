"""envvars.get: the value os.environ.get gives, after every way a test or a user sets or clears it."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from ads_kernel_tools import envvars

NAME = "ADS_TEST_ENVVARS_KNOB"


@pytest.fixture(autouse=True)
def _unset():
    os.environ.pop(NAME, None)
    yield
    os.environ.pop(NAME, None)


def test_unset_gives_the_default():
    assert envvars.get(NAME) is None
    assert envvars.get(NAME, "auto") == "auto"


def test_sees_monkeypatch_and_direct_assignment(monkeypatch):
    monkeypatch.setenv(NAME, "1")
    assert envvars.get(NAME, "0") == "1"
    os.environ[NAME] = "tma"
    assert envvars.get(NAME) == "tma" == os.environ.get(NAME)
    monkeypatch.delenv(NAME)
    assert envvars.get(NAME, "x") == "x"


def test_sees_patch_dict_and_clear():
    with mock.patch.dict(os.environ, {NAME: "on"}):
        assert envvars.get(NAME) == "on"
    assert envvars.get(NAME) is None
    os.environ[NAME] = "é"  # non-ASCII values decode as os.environ decodes them
    assert envvars.get(NAME) == os.environ[NAME]


def test_falls_back_when_os_environ_is_replaced(monkeypatch):
    monkeypatch.setattr(os, "environ", {NAME: "replaced"})
    assert envvars.get(NAME) == "replaced"


def test_snapshot_changes_with_each_knob(monkeypatch):
    """Equal snapshots exactly when every named knob is equal: set, changed, patched, cleared."""
    other = NAME + "_2"
    monkeypatch.delenv(other, raising=False)
    names = (NAME, other)
    unset = envvars.snapshot(names)
    assert unset == (None, None)
    monkeypatch.setenv(NAME, "1")
    one = envvars.snapshot(names)
    assert one != unset and one == envvars.snapshot(names)
    monkeypatch.setenv(other, "1")
    assert envvars.snapshot(names) not in (one, unset)
    with mock.patch.dict(os.environ, {NAME: "2"}):
        assert envvars.snapshot(names) != envvars.snapshot(names[:1]) + (None,)
        assert envvars.snapshot(names[:1]) != (one[0],)
    monkeypatch.delenv(other)
    assert envvars.snapshot(names) == one


def test_snapshot_follows_a_replaced_environ(monkeypatch):
    monkeypatch.setattr(os, "environ", {NAME: "x"})
    assert envvars.snapshot((NAME, NAME + "_2")) == ("x", None)
