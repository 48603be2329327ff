"""K-major V copies for FP8 attention kernels (``kernels.transpose``): the plain copy and the relabelled
one against index arithmetic in torch. Runs the Triton kernels on the GPU, or through the interpreter
on CPU."""

import pytest
import torch

from ads_kernel_tools.kernels.transpose import KEY_ORDER, kv_cols, v_kmajor, v_kmajor_relabel


def _fp8(shape, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 4
    return x.to(torch.float8_e4m3fn).to(device)


@pytest.mark.parametrize("tk", [1, 17, 64, 100])
def test_v_kmajor_is_the_transpose_with_zero_padding(device, tk):
    v = _fp8((tk, 2, 24), device)
    vt = v_kmajor(v)
    pad = max((tk + 15) // 16 * 16, 16)
    assert vt.dtype == v.dtype and vt.shape == (48, pad) and vt.is_contiguous()
    bits, want = vt.view(torch.uint8).cpu(), v.view(torch.uint8).reshape(tk, 48).t().cpu()
    assert torch.equal(bits[:, :tk], want)
    assert not bits[:, tk:].any()


def test_key_order_is_a_permutation_of_each_32_group():
    assert sorted(KEY_ORDER) == list(range(32))
    assert KEY_ORDER[:4] == [0, 1, 8, 9]  # thread 0 of a quad: columns 0, 1, 8, 9 in the accumulator


@pytest.mark.parametrize("relabel,max_len", [(True, None), (False, None), (True, 40), (False, 200)])
def test_v_kmajor_relabel_places_each_sequence_in_key_order(device, relabel, max_len):
    lens = [0, 5, 40, 32, 1, 150]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    tk = int(cu[-1])
    v = _fp8((tk, 1, 16), device, seed=1)
    vt, starts = v_kmajor_relabel(v, cu, relabel=relabel, max_len=max_len)
    starts_want = [0]
    for n in lens:
        starts_want.append(starts_want[-1] + (n + 31) // 32 * 32)
    assert starts.tolist() == starts_want == kv_cols(cu).tolist()
    bits = vt.view(torch.uint8).cpu()
    src = v.view(torch.uint8).reshape(tk, 16).cpu()
    expect = torch.zeros_like(bits)
    for b, n in enumerate(lens):
        k0, c0 = int(cu[b]), starts_want[b]
        for pos in range((n + 31) // 32 * 32):
            key = pos - pos % 32 + KEY_ORDER[pos % 32] if relabel else pos
            if key < n:
                expect[:, c0 + pos] = src[k0 + key]
    assert vt.shape[1] % 16 == 0 and vt.shape[1] >= starts_want[-1]
    assert torch.equal(bits, expect)
