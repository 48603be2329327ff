"""The window band test of the Gluon backward (the forward bounds its masked rows by column ranges)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def in_band(shifted, win_left, win_right):
    """Whether key - (row + off) lies in [-win_left, win_right], given ``shifted`` = key - (row + off)
    + win_left: one unsigned compare against the band's width instead of two signed ones. The sides
    are resolved to at most ``launch.BIG`` = 2^30 with a non-negative sum, so neither sum overflows
    int32. Callers form ``shifted``'s scalar part per row or column first, then add per score."""
    return shifted.to(gl.uint32, bitcast=True) <= (win_left + win_right).to(gl.uint32, bitcast=True)
