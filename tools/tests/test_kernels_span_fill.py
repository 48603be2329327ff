"""zero_outside_spans: zeros exactly the rows no span covers, leaves the spans untouched."""

import pytest
import torch

from ads_kernel_tools.kernels.offsets import clamp_offsets
from ads_kernel_tools.kernels.span_fill import zero_outside_spans


def _expected_zero_rows(cu, rows, max_len, used):
    covered = torch.zeros(rows, dtype=torch.bool)
    for b in range(len(cu) - 1):
        n = min(cu[b + 1] - cu[b], max_len)
        if used is not None:
            n = min(n, max(used[b], 0))
        covered[cu[b] : cu[b] + max(n, 0)] = True
    return ~covered


@pytest.mark.parametrize(
    "raw,rows,max_len,used",
    [
        ([0, 5, 5, 300, 301], 301, 1000, None),  # spans cover every row: nothing to zero
        ([3, 40, 41, 250], 300, 1000, None),  # rows before the first and after the last span
        ([0, 100, 150, 400], 400, 64, None),  # keys past max_len
        ([0, 100, 150, 400], 400, 1000, [7, -3, 10_000]),  # seqused, negative and too long
        ([0, 9000], 9000, 1000, [0]),  # one sequence with a long tail: chunks stride it
        ([50, 20, 80, 500], 300, 1000, None),  # bad offsets, clamped first
    ],
)
@pytest.mark.parametrize("two", [False, True])
def test_zeroes_the_complement_of_the_spans(raw, rows, max_len, used, two, device):
    cu = clamp_offsets(torch.tensor(raw, dtype=torch.int32, device=device), rows)[0]
    nan = float("nan")
    bufs = [torch.full((rows, 3, 8), nan, dtype=torch.bfloat16, device=device) for _ in range(1 + two)]
    used_t = torch.tensor(used, dtype=torch.int32, device=device) if used is not None else None
    zero_outside_spans(bufs, cu, max_len, used_t)
    want = _expected_zero_rows(cu.cpu().tolist(), rows, max_len, used)
    for buf in bufs:
        buf = buf.float().cpu()
        assert (buf[want] == 0).all()
        assert buf[~want].isnan().all(), "rows inside a span must not be written"


def test_rejects_mismatched_buffers(device):
    cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
    a = torch.zeros(4, 8, device=device)
    with pytest.raises(ValueError, match="shapes"):
        zero_outside_spans([a, torch.zeros(4, 9, device=device)], cu, 4)
    with pytest.raises(ValueError, match="one or two"):
        zero_outside_spans([a, a, a], cu, 4)
    with pytest.raises(ValueError, match="contiguous"):
        zero_outside_spans([torch.zeros(8, 4, device=device).t()], cu, 4)


@pytest.mark.parametrize("span_fill_runs", [True, False])
def test_zero_unwritten_calls_a_used_function_only_for_the_span_fill(span_fill_runs, monkeypatch, device):
    """``used`` given as a function: called (once) when the span fill runs; below its size threshold
    the whole buffer is zeroed and the function is never called."""
    from ads_kernel_tools.kernels import span_fill

    monkeypatch.setattr(span_fill, "SPAN_FILL_MIN_BYTES", 0 if span_fill_runs else 1 << 40)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32, device=device)
    buf = torch.full((30, 8), float("nan"), device=device)
    calls = []

    def used():
        calls.append(1)
        return torch.tensor([4, 20], dtype=torch.int32, device=device)

    span_fill.zero_unwritten([buf], cu, 100, used)
    assert len(calls) == (1 if span_fill_runs else 0)
    want = torch.ones(30, dtype=torch.bool)  # the plain fill: every row
    if span_fill_runs:
        want = _expected_zero_rows([0, 10, 30], 30, 100, [4, 20])
    assert (buf.cpu()[want] == 0).all() and buf.cpu()[~want].isnan().all()
