"""jagged_attention (the ads-jfa core): cross attention with independent offsets, the top-left
symmetric window, rows past max_seqlen_q, empty kv sequences, broadcast_q, GQA."""

from __future__ import annotations

import pytest
import torch
from fa4_testlib import jagged_case

LQ = (5, 0, 17, 33, 1)
LK = (16, 3, 0, 40, 1)


@pytest.mark.parametrize("window", [None, 0, 3, 20])
def test_cross_attention_windows(window, device):
    jagged_case(LQ, LK, max_q=33, window=window, device=device)


def test_rows_past_max_seqlen_q_are_zero(device):
    jagged_case(LQ, LK, max_q=16, window=2, device=device)


def test_broadcast_q_window_gqa(device):
    jagged_case((17,), (5, 0, 33), max_q=17, window=4, broadcast_q=True, heads=4, kv_heads=2, device=device)


def test_fp16_no_grad_large_head(device):
    jagged_case((9, 18), (18, 9), max_q=18, d=128, dtype=torch.float16, grad=False, device=device)
