"""What every backend needs besides the kernels: the problem description, the mask vocabulary,
trustworthy offsets and the gradient buffers. Backend-neutral: no Triton or Gluon here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from ads_kernel_tools.offsets import check_inputs_enabled, validate_offsets

BIG = 1 << 30  # "unbounded" band side: longer than any sequence, and window arithmetic stays in int32


class MaskMode(enum.IntEnum):
    """Which band a forward applies (spec §1.2)."""

    NONE = 0
    TOP_LEFT = 1  # upstream symmetric window |i - j| <= w from each sequence's start
    BOTTOM_RIGHT = 2  # FlashAttention causal / local: the last query aligned with the last key


@dataclass(frozen=True)
class Problem:
    """Everything a launch needs besides tensors. win_left/right = BIG means unbounded."""

    max_q: int
    max_k: int
    act: int
    scale: float
    mask: MaskMode
    win_left: int
    win_right: int
    broadcast_q: bool
    host_q: tuple[int, ...] | None = None  # CPU copy of cu_seqlens_q (enables host tile maps)
    host_k: tuple[int, ...] | None = None

    @property
    def has_window(self) -> bool:
        return self.mask != MaskMode.NONE

    @property
    def bottom_right(self) -> bool:
        return self.mask == MaskMode.BOTTOM_RIGHT


def out_rows(q: torch.Tensor, cu_k: torch.Tensor, broadcast_q: bool) -> int:
    """Output rows: q's, or one copy of the shared query sequence per kv sequence (broadcast_q)."""
    return (cu_k.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]


def spans(host, rows: int) -> bool:
    """True when host offsets (a tuple or a CPU tensor) are known and their sequences cover rows
    [0, rows) exactly."""
    return host is not None and int(host[0]) == 0 and int(host[-1]) == rows


def check_offsets(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    host_q: torch.Tensor | None,
    host_k: torch.Tensor | None,
    max_k: int,
    broadcast_q: bool,
) -> tuple[int | None, int | None]:
    """Value checks of the offsets (``ads_kernel_tools.offsets.validate_offsets``), raised from inside
    the op so that they also hold under torch.compile, where the Python wrapper only sees fake
    tensors. Host copies are checked when given; device offsets only under ``ADS_CHECK_INPUTS=1``
    (one sync per call). Returns the longest query and key sequences of the host copies (None
    without them)."""
    longest = []
    checks = (
        ("cu_seqlens_q", cu_q, host_q, q.shape[0], None),
        ("cu_seqlens_k", cu_k, host_k, k.shape[0], max_k),
    )
    for name, dev, host, rows, max_len in checks:
        values = host if host is not None else (dev if check_inputs_enabled() else None)
        if values is None:
            longest.append(None)
            continue
        lengths = validate_offsets(
            name, values, rows, max_len=max_len, max_name="max_seqlen_k", prefix="ads_gdpa: "
        )
        if broadcast_q and name == "cu_seqlens_q" and (int(values[0]) != 0 or int(values[-1]) != rows):
            raise ValueError(
                f"ads_gdpa: broadcast_q needs cu_seqlens_q == [0, {rows}], got {values.tolist()}"
            )
        longest.append(int(lengths.max()) if lengths.size and host is not None else None)
    return longest[0], longest[1]


def check_descales(descales: tuple[torch.Tensor, ...]) -> None:
    """FP8 descales must be positive (amax scaling gives amax / 448 >= 0; the Hopper kernel folds
    q_descale·k_descale into the activation's constants, which needs its sign). Their values are read
    where they are host data, and for device tensors only under ``ADS_CHECK_INPUTS=1`` (a sync)."""
    for name, t in zip(("q_descale", "k_descale", "v_descale"), descales):
        if t.device.type == "cpu" or check_inputs_enabled():
            values = t.detach().to("cpu", torch.float32)
            if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
                raise ValueError(f"ads_gdpa: {name} must be finite and >= 0, got {values.tolist()}")


def safe_offsets(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    checked: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets every kernel may trust to stay inside q/k/v and the outputs: int32 copies clamped
    on the device (``ads_kernel_tools.kernels.offsets``), unless host copies were validated against
    the tensors (``checked``: both sides had host offsets), which the caller promises equal the
    device ones. One small launch, no sync; self-attention offsets are clamped once."""
    if checked and cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32:
        return cu_q, cu_k
    if checked:
        return cu_q.to(torch.int32), (cu_q.to(torch.int32) if cu_k is cu_q else cu_k.to(torch.int32))
    from ads_kernel_tools.kernels.offsets import clamp_offsets

    return clamp_offsets(cu_q, q.shape[0], cu_k, k.shape[0])


def grad_buffers(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, covered: tuple[bool, bool], deterministic: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq_acc, dk, dv) for a backward kernel to fill: dq_acc is a zeroed fp32 accumulator for
    atomic dQ, or a buffer like q for the deterministic pass, which writes every row of every
    sequence (zeros past max_q). Kernels write only rows inside some sequence; offsets need not span
    the tensors (leading or trailing rows are allowed) and those rows' gradients are zero, so buffers
    start zeroed unless host offsets prove that the sequences cover every row (``covered``: for the
    query and the key offsets, see ``spans``)."""
    q_spans, k_spans = covered
    dk = torch.empty_like(k) if k_spans else torch.zeros_like(k)
    dv = torch.empty_like(v) if k_spans else torch.zeros_like(v)
    if not deterministic:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    else:
        dq_acc = torch.empty_like(q) if q_spans else torch.zeros_like(q)
    return dq_acc, dk, dv
