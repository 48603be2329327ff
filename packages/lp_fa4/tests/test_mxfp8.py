"""MXFP8 API: metadata, quantisation bit-exact with the tools reference (both scaling modes, special
values, padding of odd lengths, the blocked scale layout by its index formula), dequantisation, the
accuracy gates of spec §1.3 against fp32 attention of the original inputs, dK/dV as MXFP8, broadcast_q,
and bad inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ads_kernel_tools.capability import interpreter_active
from ads_kernel_tools.reference.attention import softmax_attention_varlen_ref
from ads_kernel_tools.reference.mxfp8 import (
    dequantize_mxfp8,
    e8m0_to_float,
    quantize_mxfp8,
    quantize_mxfp8_along,
)
from ads_kernel_tools.testing import randn
from ads_kernel_tools.tolerance import cosine_similarity, sqnr_db
from lp_fa4 import (
    Mxfp8VarlenMeta,
    Mxfp8VarlenTensor,
    mxfp8_flash_attn_varlen_backward,
    mxfp8_flash_attn_varlen_forward,
    quantize_mxfp8_varlen,
)
from lp_fa4.mxfp8 import dequantize_mxfp8_varlen

D = 128
MODES = ("rceil", "floor")


@pytest.fixture
def attn_device(device):
    """The test device for calls that launch kernels: CPU tensors need the Triton interpreter."""
    if device == "cpu" and not interpreter_active():
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1")
    return device


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# --- metadata ----------------------------------------------------------------------------------------


def test_meta_spec_example(device):
    meta = Mxfp8VarlenMeta.from_lengths([17, 0, 129], device=device)
    assert meta.cu_seqlens.tolist() == [0, 17, 17, 146]
    assert meta.cu_seqlens_sf.tolist() == [0, 128, 128, 384]
    assert meta.cu_seqlens.dtype == meta.cu_seqlens_sf.dtype == torch.int32
    assert meta.cu_seqlens.device.type == meta.cu_seqlens_sf.device.type == torch.device(device).type
    assert meta.cpu_cu_seqlens.device.type == "cpu" and meta.cpu_cu_seqlens.tolist() == [0, 17, 17, 146]
    assert (meta.total_tokens, meta.padded_tokens, meta.batch_size, meta.max_seqlen) == (146, 384, 3, 129)
    cu = meta.cu_seqlens
    for again in (Mxfp8VarlenMeta.from_cu_seqlens(cu), Mxfp8VarlenMeta.from_cu_seqlens(cu, cu.cpu())):
        assert again.cu_seqlens_sf.tolist() == [0, 128, 128, 384] and again.max_seqlen == 129
    assert Mxfp8VarlenMeta.from_lengths(torch.tensor([128, 1]), device=device).cu_seqlens_sf.tolist() == [
        0,
        128,
        256,
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.max_seqlen = 5


def test_meta_numpy_integers():
    """NumPy integers are lengths and a max_seqlen like ints (stored as ints)."""
    meta = Mxfp8VarlenMeta.from_lengths([np.int64(17), np.int32(0)], device="cpu")
    assert meta.cu_seqlens_sf.tolist() == [0, 128, 128] and type(meta.max_seqlen) is int
    again = Mxfp8VarlenMeta(meta.cu_seqlens, meta.cu_seqlens_sf, np.int64(17), meta.cpu_cu_seqlens)
    assert type(again.max_seqlen) is int and again.max_seqlen == 17


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


META_ERRORS = {
    "no-sequences": lambda: Mxfp8VarlenMeta.from_lengths([], device="cpu"),
    "negative-length": lambda: Mxfp8VarlenMeta.from_lengths([3, -1], device="cpu"),
    "float-length": lambda: Mxfp8VarlenMeta.from_lengths([3, 2.0], device="cpu"),
    "bool-length": lambda: Mxfp8VarlenMeta.from_lengths([True], device="cpu"),
    "str-length": lambda: Mxfp8VarlenMeta.from_lengths(["3"], device="cpu"),
    "float-max": lambda: Mxfp8VarlenMeta(_i32([0, 17]), _i32([0, 128]), 17.0, _i32([0, 17])),
    "int64-offsets": lambda: Mxfp8VarlenMeta.from_cu_seqlens(torch.tensor([0, 4])),
    "2d-offsets": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([[0, 4]])),
    "one-entry": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([0])),
    "not-from-zero": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([1, 4])),
    "decreasing": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([0, 4, 3])),
    "non-contiguous": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([0, 9, 4, 9, 8])[::2]),
    "cpu-copy-differs": lambda: Mxfp8VarlenMeta.from_cu_seqlens(_i32([0, 4]), _i32([0, 5])),
    "unpadded-sf": lambda: Mxfp8VarlenMeta(_i32([0, 17, 146]), _i32([0, 17, 146]), 129, _i32([0, 17, 146])),
    "sf-short-by-one-tile": lambda: Mxfp8VarlenMeta(_i32([0, 129]), _i32([0, 128]), 129, _i32([0, 129])),
    "wrong-max": lambda: Mxfp8VarlenMeta(_i32([0, 17]), _i32([0, 128]), 16, _i32([0, 17])),
    "cpu-differs": lambda: Mxfp8VarlenMeta(_i32([0, 17]), _i32([0, 128]), 17, _i32([0, 18])),
}


@pytest.mark.parametrize("name", list(META_ERRORS))
def test_meta_errors(name):
    with pytest.raises(ValueError, match="Mxfp8VarlenMeta"):
        META_ERRORS[name]()


# --- quantisation ------------------------------------------------------------------------------------

LENGTHS = (17, 0, 129, 1, 31, 33)  # odd lengths, an empty sequence, one just past a 128-token tile
H = 2


def _source(lengths, device, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Normal data with per-32-block magnitudes from 2^-40 to 2^40, plus NaN, +-inf, an all-zero block,
    maxima at and around 448·2^e (exact ratios, just above, the floor-mode clipping band), fp32's
    largest finite value and denormals."""
    t = sum(lengths)
    x = randn((t, H, D), seed=seed)
    mags = torch.exp2(
        torch.randint(-40, 41, (t, H, D // 32, 1), generator=torch.Generator().manual_seed(seed))
    )
    x = (x.view(t, H, D // 32, 32) * mags).view(t, H, D)
    specials = [
        (0, 0, 3, float("nan")),
        (5, 1, 40, float("inf")),
        (9, 0, 100, float("-inf")),
        (20, 1, 64, 448.0),
        (21, 1, 64, 449.0),
        (22, 0, 0, 500.0),
        (23, 0, 33, -512.0),
        (24, 1, 127, 3.0e38),
        (25, 0, 96, 448.0 * 2.0**-20),
        (26, 1, 10, 1.0e-40),
    ]
    for r, h, c, val in specials:
        if r < t:
            x[r, h, c] = val
    if t > 30:
        x[30, 0, 32:64] = 0.0  # a zero block along D
        x[27, 1] = 1.0e-41  # a row of denormals
    return x.to(device=device, dtype=dtype).contiguous()


def _expected_hdim_scale(ref_scales: torch.Tensor, meta: Mxfp8VarlenMeta) -> torch.Tensor:
    """Blocked hdim bytes from the per-token (T, H, 4) reference scales, by the layout's index formula:
    (head h, padded row p, column c) -> h·4P + (p // 128)·512 + (p % 32)·16 + ((p % 128) // 32)·4 + c."""
    t, h, _ = ref_scales.shape
    p_total = meta.padded_tokens
    cu, sf = meta.cpu_cu_seqlens.tolist(), meta.cu_seqlens_sf.cpu().tolist()
    p = torch.cat([torch.arange(sf[b], sf[b] + cu[b + 1] - cu[b]) for b in range(meta.batch_size)])
    hh, pp, cc = torch.meshgrid(torch.arange(h), p, torch.arange(4), indexing="ij")  # (H, T, 4)
    pos = hh * 4 * p_total + (pp // 128) * 512 + (pp % 32) * 16 + ((pp % 128) // 32) * 4 + cc
    flat = torch.zeros(h * p_total * 4, dtype=torch.uint8)
    flat[pos.reshape(-1)] = ref_scales.cpu().permute(1, 0, 2).reshape(-1)
    return flat


def _expected_seq_scale(ref_scales: torch.Tensor, h: int, p_total: int) -> torch.Tensor:
    """Blocked seq bytes from (P/32, H, 128) reference scales: (head h, dim d, block j) ->
    h·4P + (j // 4)·512 + (d % 32)·16 + (d // 32)·4 + j % 4."""
    jj, hh, dd = torch.meshgrid(torch.arange(p_total // 32), torch.arange(h), torch.arange(D), indexing="ij")
    pos = hh * 4 * p_total + (jj // 4) * 512 + (dd % 32) * 16 + (dd // 32) * 4 + jj % 4
    flat = torch.zeros(h * p_total * 4, dtype=torch.uint8)
    flat[pos.reshape(-1)] = ref_scales.cpu().reshape(-1)
    return flat


def _reference_seq(x: torch.Tensor, meta: Mxfp8VarlenMeta, mode: str):
    """Per sequence: zero-pad to 128 tokens, quantise along tokens with the tools reference."""
    cu, sf = meta.cpu_cu_seqlens.tolist(), meta.cu_seqlens_sf.cpu().tolist()
    datas, scales = [], []
    for b in range(meta.batch_size):
        n, n_pad = cu[b + 1] - cu[b], sf[b + 1] - sf[b]
        if n_pad == 0:
            continue
        padded = torch.zeros((n_pad, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[:n] = x[cu[b] : cu[b + 1]]
        data, scale = quantize_mxfp8_along(padded, 0, mode)
        datas.append(data[:n])
        scales.append(scale)
    return torch.cat(datas), torch.cat(scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", MODES)
def test_quantize_bit_exact(mode, dtype, device):
    meta = Mxfp8VarlenMeta.from_lengths(LENGTHS, device=device)
    x = _source(LENGTHS, device, dtype)
    q = quantize_mxfp8_varlen(x, meta, scaling_mode=mode)
    p = meta.padded_tokens
    assert q.hdim.dtype == q.seq.dtype == torch.float8_e4m3fn
    assert q.hdim.shape == q.seq.shape == x.shape
    assert q.hdim_scale.dtype == q.seq_scale.dtype == torch.uint8
    assert q.hdim_scale.shape == (H * p // 4, 16) and q.seq_scale.shape == (H * 32, p // 8)

    ref_data, ref_scales = quantize_mxfp8(x, mode)
    assert torch.equal(_bytes(q.hdim), _bytes(ref_data))
    assert torch.equal(q.hdim_scale.cpu().reshape(-1), _expected_hdim_scale(ref_scales, meta))

    ref_seq, ref_seq_scales = _reference_seq(x, meta, mode)
    assert torch.equal(_bytes(q.seq), _bytes(ref_seq))
    assert torch.equal(q.seq_scale.cpu().reshape(-1), _expected_seq_scale(ref_seq_scales, H, p))
    # the special values did reach both paths: NaN blocks give byte 255
    assert (ref_scales == 255).any() and (ref_seq_scales == 255).any()


def test_quantize_orientations_alone(device):
    meta = Mxfp8VarlenMeta.from_lengths([40, 129], device=device)
    x = _source([40, 129], device)
    both = quantize_mxfp8_varlen(x, meta, orientations="both", scaling_mode="floor")
    hdim = quantize_mxfp8_varlen(x, meta, orientations="hdim", scaling_mode="floor")
    seq = quantize_mxfp8_varlen(x, meta, orientations="seq", scaling_mode="floor")
    assert hdim.seq is None and hdim.seq_scale is None and seq.hdim is None and seq.hdim_scale is None
    assert torch.equal(_bytes(hdim.hdim), _bytes(both.hdim)) and torch.equal(hdim.hdim_scale, both.hdim_scale)
    assert torch.equal(_bytes(seq.seq), _bytes(both.seq)) and torch.equal(seq.seq_scale, both.seq_scale)


@pytest.mark.parametrize("mode", MODES)
def test_dequantize(mode, device):
    lengths = (33, 0, 130)
    meta = Mxfp8VarlenMeta.from_lengths(lengths, device=device)
    x = randn((sum(lengths), H, D), device=device, seed=3) * 5
    q = quantize_mxfp8_varlen(x, meta, scaling_mode=mode)
    ref_data, ref_scales = quantize_mxfp8(x, mode)
    got = dequantize_mxfp8_varlen(q, meta, "hdim", dtype=torch.float32)
    assert torch.equal(got, dequantize_mxfp8(ref_data, ref_scales))
    ref_seq, ref_seq_scales = _reference_seq(x, meta, mode)
    cu, sf = meta.cpu_cu_seqlens.tolist(), meta.cu_seqlens_sf.cpu().tolist()
    want = []
    for b in range(meta.batch_size):
        n = cu[b + 1] - cu[b]
        blocks = ref_seq_scales[sf[b] // 32 : sf[b + 1] // 32].repeat_interleave(32, dim=0)[:n]
        want.append(ref_seq[cu[b] : cu[b + 1]].float() * e8m0_to_float(blocks))
    assert torch.equal(dequantize_mxfp8_varlen(q, meta, "seq", dtype=torch.float32), torch.cat(want))
    # and against the original data: E4M3 keeps 3 mantissa bits (relative step 2^-3, rounding half of it)
    bf = dequantize_mxfp8_varlen(q, meta, "seq")
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, torch.cat(want).to(torch.bfloat16))
    assert torch.equal(dequantize_mxfp8_varlen(q, meta, "hdim"), got.to(torch.bfloat16))
    rel = ((bf.float() - x).abs() / x.abs().clamp(min=1e-3)).median().item()
    assert rel < 2.0**-4


def test_quantize_errors(device):
    meta = Mxfp8VarlenMeta.from_lengths([5, 7], device=device)
    x = torch.randn(12, 2, D, device=device)
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        quantize_mxfp8_varlen(x.half(), meta)
    with pytest.raises(ValueError, match="128"):
        quantize_mxfp8_varlen(torch.randn(12, 2, 64, device=device), meta)
    with pytest.raises(ValueError, match="tokens"):
        quantize_mxfp8_varlen(x[:11], meta)
    with pytest.raises(ValueError, match="contiguous"):
        quantize_mxfp8_varlen(torch.randn(2, 12, D, device=device).transpose(0, 1), meta)
    with pytest.raises(ValueError, match="orientations"):
        quantize_mxfp8_varlen(x, meta, orientations="dim")
    with pytest.raises(ValueError, match="scaling_mode"):
        quantize_mxfp8_varlen(x, meta, scaling_mode="ceil")
    with pytest.raises(TypeError, match="Mxfp8VarlenMeta"):
        quantize_mxfp8_varlen(x, meta.cu_seqlens)
    with pytest.raises(ValueError, match="empty"):
        quantize_mxfp8_varlen(x[:0], Mxfp8VarlenMeta.from_lengths([0, 0], device=device))


# --- attention ---------------------------------------------------------------------------------------

GATES = {"out": (0.98, 8.0), "dq": (0.97, 10.0), "dk": (0.97, 8.0), "dv": (0.97, 8.0)}


def _check(name, got, ref, spans, cos_min, sqnr_min):
    """Cosine and SQNR over all tokens and per sequence (spans of the token axis)."""
    for label, (a, b) in [("overall", (0, ref.shape[0])), *((f"seq{i}", s) for i, s in enumerate(spans))]:
        if b == a:
            continue
        cos, sqnr = cosine_similarity(got[a:b], ref[a:b]), sqnr_db(got[a:b], ref[a:b])
        assert cos > cos_min and sqnr > sqnr_min, f"{name} {label}: cosine {cos:.4f}, SQNR {sqnr:.1f} dB"


def _fp32_attention(q, k, v, cu_q, cu_k, dout, **kw):
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, lse = softmax_attention_varlen_ref(q, k, v, cu_q, cu_k, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout.float())
    return out.detach(), lse, grads


def test_accuracy_gates(attn_device):
    """Spec §1.3's gates at lengths 127 and 257 (and an empty sequence) against fp32 attention of the
    original inputs; then, tighter, against fp32 attention of the dequantised inputs (what the
    dequantise-then-BF16 path computes up to bf16 rounding). The spec's 16 heads on a GPU; one head
    keeps the interpreter fast."""
    dev = attn_device
    lengths, heads = (127, 0, 257), 16 if dev == "cuda" else 1
    meta = Mxfp8VarlenMeta.from_lengths(lengths, device=dev)
    q, k, v = (randn((sum(lengths), heads, D), device=dev, seed=s) for s in (10, 11, 12))
    dout = randn((sum(lengths), heads, D), device=dev, seed=13, dtype=torch.bfloat16)
    mq, mk, mv = (quantize_mxfp8_varlen(t, meta) for t in (q, k, v))
    out, lse = mxfp8_flash_attn_varlen_forward(mq, mk, mv, meta, meta)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (heads, sum(lengths))
    dq, dk, dv = mxfp8_flash_attn_varlen_backward(mq, mk, mv, out, dout, lse, meta, meta)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16

    cu = meta.cpu_cu_seqlens.tolist()
    spans = list(zip(cu, cu[1:]))
    ref_out, ref_lse, (rq, rk, rv) = _fp32_attention(q, k, v, meta.cu_seqlens, meta.cu_seqlens, dout)
    got = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    for name, ref in zip(GATES, (ref_out, rq, rk, rv)):
        _check(name, got[name].float(), ref, spans, *GATES[name])
    assert (lse - ref_lse).abs().max().item() < 0.05

    deq = (
        dequantize_mxfp8_varlen(mq, meta, "hdim", dtype=torch.float32),
        dequantize_mxfp8_varlen(mk, meta, "hdim", dtype=torch.float32),
        dequantize_mxfp8_varlen(mv, meta, "seq", dtype=torch.float32),
    )
    ref_out_d, ref_lse_d, _ = _fp32_attention(*deq, meta.cu_seqlens, meta.cu_seqlens, dout)
    _check("out vs dequantised", out.float(), ref_out_d, spans, 0.9999, 40.0)
    assert (lse - ref_lse_d).abs().max().item() < 1e-3
    v_h = dequantize_mxfp8_varlen(mv, meta, "hdim", dtype=torch.float32)  # the backward reads V.hdim
    _, _, grads_d = _fp32_attention(deq[0], deq[1], v_h, meta.cu_seqlens, meta.cu_seqlens, dout)
    for name, got_g, ref_g in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_d):
        _check(f"{name} vs dequantised", got_g.float(), ref_g, spans, 0.999, 30.0)


def test_backward_mxfp8_dkv(attn_device):
    """output_mxfp8_dkv=True: E4M3 dK/dV with uint8 (Tk, H, 4) scales, exactly the rceil quantisation of
    the BF16 gradients (the backward is deterministic)."""
    dev = attn_device
    lengths = (33, 70)
    meta = Mxfp8VarlenMeta.from_lengths(lengths, device=dev)
    q, k, v = (randn((sum(lengths), 1, D), device=dev, seed=s) for s in (20, 21, 22))
    mq, mk, mv = (quantize_mxfp8_varlen(t, meta) for t in (q, k, v))
    out, lse = mxfp8_flash_attn_varlen_forward(mq, mk, mv, meta, meta, softmax_scale=0.05)
    dout = randn(out.shape, device=dev, seed=23, dtype=torch.bfloat16)
    dq, dk, dv = mxfp8_flash_attn_varlen_backward(mq, mk, mv, out, dout, lse, meta, meta, softmax_scale=0.05)
    res = mxfp8_flash_attn_varlen_backward(
        mq, mk, mv, out, dout, lse, meta, meta, softmax_scale=0.05, output_mxfp8_dkv=True
    )
    assert len(res) == 5
    dq2, dk8, dv8, sf_dk, sf_dv = res
    assert torch.equal(dq2, dq)
    for g8, sf, g in ((dk8, sf_dk, dk), (dv8, sf_dv, dv)):
        assert g8.dtype == torch.float8_e4m3fn and g8.shape == (sum(lengths), 1, D)
        assert sf.dtype == torch.uint8 and sf.shape == (sum(lengths), 1, 4)
        ref8, ref_sf = quantize_mxfp8(g, "rceil")
        assert torch.equal(_bytes(g8), _bytes(ref8)) and torch.equal(sf, ref_sf)
        assert cosine_similarity(dequantize_mxfp8(g8, sf), g) > 0.99


def test_broadcast_q(attn_device):
    """One query sequence against each of two K/V sequences: out (B·Lq, H, 128), dQ summed."""
    dev = attn_device
    q_meta = Mxfp8VarlenMeta.from_lengths([20], device=dev)
    k_meta = Mxfp8VarlenMeta.from_lengths([7, 30], device=dev)
    q = randn((20, 1, D), device=dev, seed=30)
    k, v = (randn((37, 1, D), device=dev, seed=s) for s in (31, 32))
    mq = quantize_mxfp8_varlen(q, q_meta)
    mk, mv = (quantize_mxfp8_varlen(t, k_meta) for t in (k, v))
    out, lse = mxfp8_flash_attn_varlen_forward(mq, mk, mv, q_meta, k_meta, broadcast_q=True)
    assert out.shape == (40, 1, D) and lse.shape == (1, 40)
    dout = randn(out.shape, device=dev, seed=33, dtype=torch.bfloat16)
    dq, dk, dv = mxfp8_flash_attn_varlen_backward(
        mq, mk, mv, out, dout, lse, q_meta, k_meta, broadcast_q=True
    )
    assert dq.shape == q.shape and dk.shape == k.shape
    qd = dequantize_mxfp8_varlen(mq, q_meta, "hdim", dtype=torch.float32)
    kd, vd = (dequantize_mxfp8_varlen(t, k_meta, "hdim", dtype=torch.float32) for t in (mk, mv))
    cu_q = torch.tensor([0, 20, 40], dtype=torch.int32, device=dev)
    vs = dequantize_mxfp8_varlen(mv, k_meta, "seq", dtype=torch.float32)
    ref_out, _, _ = _fp32_attention(qd.repeat(2, 1, 1), kd, vs, cu_q, k_meta.cu_seqlens, dout)
    _check("out", out.float(), ref_out, [(0, 20), (20, 40)], 0.9999, 40.0)
    _, _, (rq, rk, rv) = _fp32_attention(qd.repeat(2, 1, 1), kd, vd, cu_q, k_meta.cu_seqlens, dout)
    _check("dq", dq.float(), rq[:20] + rq[20:], [], 0.999, 30.0)
    _check("dk", dk.float(), rk, [(0, 7), (7, 37)], 0.999, 30.0)


def _operands(device, lengths=(5, 7), heads=2):
    meta = Mxfp8VarlenMeta.from_lengths(lengths, device=device)
    q, k, v = (randn((sum(lengths), heads, D), device=device, seed=s) for s in (40, 41, 42))
    return meta, [quantize_mxfp8_varlen(t, meta) for t in (q, k, v)]


def test_numpy_scale_taken_like_a_float(attn_device):
    """A numpy.float32 softmax_scale gives the output of the same float."""
    meta, (mq, mk, mv) = _operands(attn_device)
    want, _ = mxfp8_flash_attn_varlen_forward(mq, mk, mv, meta, meta, softmax_scale=0.0625)
    got, _ = mxfp8_flash_attn_varlen_forward(mq, mk, mv, meta, meta, softmax_scale=np.float32(0.0625))
    assert torch.equal(got, want)


def test_attention_errors(device):
    """Every bad input raises before a kernel runs (so CPU tensors need no interpreter here)."""
    meta, (mq, mk, mv) = _operands(device)
    fwd = mxfp8_flash_attn_varlen_forward
    heads = mq.hdim.shape[1]
    out = torch.zeros(12, heads, D, dtype=torch.bfloat16, device=device)
    lse = torch.zeros(heads, 12, device=device)

    def bwd(q=mq, k=mk, v=mv, o=out, do=out, lse_=lse, qm=meta, km=meta, **kw):
        return mxfp8_flash_attn_varlen_backward(q, k, v, o, do, lse_, qm, km, **kw)

    _, (gq, gk, gv) = _operands(device, heads=1)
    with pytest.raises(NotImplementedError, match="GQA"):
        fwd(mq, gk, gv, meta, meta)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fwd(dataclasses.replace(mq, hdim=mq.hdim.to(torch.bfloat16)), mk, mv, meta, meta)
    d64 = Mxfp8VarlenTensor(mq.hdim[..., :64].contiguous(), mq.hdim_scale)
    with pytest.raises(ValueError, match="head dim 128"):
        fwd(d64, mk, mv, meta, meta)
    with pytest.raises(ValueError, match="no seq orientation"):
        fwd(mq, mk, dataclasses.replace(mv, seq=None, seq_scale=None), meta, meta)
    with pytest.raises(TypeError, match="E8M0"):
        fwd(mq, dataclasses.replace(mk, hdim_scale=mk.hdim_scale.to(torch.int32)), mv, meta, meta)
    with pytest.raises(ValueError, match="padded"):  # scales cut to the unpadded token count
        fwd(dataclasses.replace(mq, hdim_scale=mq.hdim_scale[: heads * 12 // 4]), mk, mv, meta, meta)
    with pytest.raises(ValueError, match="tokens"):  # operands quantised against other offsets
        fwd(mq, mk, mv, meta, Mxfp8VarlenMeta.from_lengths([5, 8], device=device))
    with pytest.raises(ValueError, match="same batch"):
        fwd(mq, mk, mv, meta, Mxfp8VarlenMeta.from_lengths([12], device=device))
    with pytest.raises(ValueError, match="broadcast_q"):
        fwd(mq, mk, mv, meta, meta, broadcast_q=True)
    with pytest.raises(TypeError, match="Mxfp8VarlenMeta"):
        fwd(mq, mk, mv, meta.cu_seqlens, meta)
    with pytest.raises(TypeError, match="Mxfp8VarlenTensor"):
        fwd(mq.hdim, mk, mv, meta, meta)
    with pytest.raises(ValueError, match="softmax_scale"):
        fwd(mq, mk, mv, meta, meta, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match="lp_fa4 mxfp8: softmax_scale must be None or a finite real number"):
        fwd(mq, mk, mv, meta, meta, softmax_scale="0.0625")

    with pytest.raises(ValueError, match="q has no seq orientation"):
        bwd(q=dataclasses.replace(mq, seq=None, seq_scale=None))
    with pytest.raises(ValueError, match="v has no hdim orientation"):
        bwd(v=dataclasses.replace(mv, hdim=None, hdim_scale=None))
    with pytest.raises(TypeError, match="dout must be a bfloat16"):
        bwd(do=out.float())
    with pytest.raises(ValueError, match="out must be"):
        bwd(o=out[:11])
    with pytest.raises(ValueError, match="lse"):
        bwd(lse_=lse.t())
    with pytest.raises(ValueError, match="p_scale_mode"):
        bwd(p_scale_mode="static")
    with pytest.raises(ValueError, match="dq_accum_dtype"):
        bwd(dq_accum_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output_mxfp8_dkv"):
        bwd(output_mxfp8_dkv=1)


# --- benchmark ---------------------------------------------------------------------------------------


def test_benchmark_help(capsys):
    from lp_fa4.benchmarks import mxfp8 as bench

    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--mode", "--batch-size", "--seqlen-q", "--q-lengths", "--seqlen-k", "--k-lengths",
                 "--num-heads", "--broadcast-q", "--seed", "--warmup-ms", "--measure-ms",
                 "--launches-per-sample", "--scaling-mode", "--dq-accum-dtype", "--p-scale-mode",
                 "--output"):  # fmt: skip
        assert flag in text
    with pytest.raises(SystemExit) as exc:  # 3 query lengths for a batch of 2
        bench.main(["--batch-size", "2", "--q-lengths", "1,2,3", "--seqlen-k", "4", "--num-heads", "1"])
    assert exc.value.code == 2
    if not torch.cuda.is_available() and not interpreter_active():  # nothing to run on: says so, exits 2
        assert (
            bench.main(["--batch-size", "1", "--seqlen-q", "4", "--seqlen-k", "4", "--num-heads", "1"]) == 2
        )


def test_benchmark_smoke(attn_device, tmp_path):
    """The whole protocol on a tiny shape (the CPU run: wall-clock samples through the interpreter)."""
    from lp_fa4.benchmarks import mxfp8 as bench

    path = tmp_path / "mxfp8.json"
    argv = ["--batch-size", "2", "--q-lengths", "5,17", "--seqlen-k", "20", "--num-heads", "1",
            "--warmup-ms", "0", "--measure-ms", "0", "--launches-per-sample", "1", "--scaling-mode", "floor",
            "--bf16-peer", "--accuracy", "--output", str(path)]  # fmt: skip
    assert bench.main(argv) == 0
    rec = __import__("json").loads(path.read_text())
    assert rec["argv"] == argv and rec["scaling_mode"] == "floor" and rec["bwd_output_mxfp8_dkv"]
    assert rec["cu_seqlens_q"] == [0, 5, 22] and rec["cu_seqlens_sf_q"] == [0, 128, 256]
    assert rec["cu_seqlens_sf_k"] == [0, 128, 256]
    assert {"python", "platform", "torch", "gpu", "lp_fa4"} <= set(rec["environment"])
    work = 5 * 20 + 17 * 20
    for name, factor in (("fwd", 4), ("bwd", 10), ("bf16_fwd", 4), ("bf16_bwd", 10)):
        res = rec["results"][name]
        assert res["samples"] == len(res["samples_ms"]) >= 1
        assert res["min_ms"] <= res["median_ms"] <= res["max_ms"]
        assert res["flop"] == factor * 1 * 128 * work
        assert res["tflops"] == pytest.approx(res["flop"] / (res["mean_ms"] * 1e9))
    for name, (cos_min, sqnr_min) in GATES.items():
        assert rec["accuracy"][name]["cosine"] > cos_min and rec["accuracy"][name]["sqnr_db"] > sqnr_min
