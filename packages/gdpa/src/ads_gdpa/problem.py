"""What every backend needs besides the kernels: the problem description, the mask vocabulary,
trustworthy offsets and the gradient buffers. Backend-neutral: no Triton or Gluon here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from ads_kernel_tools import checks
from ads_kernel_tools.offsets import check_inputs_enabled, validate_offsets

BIG = 1 << 30  # "unbounded" band side: longer than any sequence, and window arithmetic stays in int32


class Fused(enum.IntEnum):
    """Upstream fused input layouts: views into one tensor, never copied."""

    NONE = 0
    KV = 1  # k is (Tk, H_kv, 2·D): [k | v] per head; v is None
    QKV = 2  # q is (T, H, 3·D): [q | k | v] per head; k and v are None (H_kv = H, keys = queries' rows)


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
    # upstream extras (Triton only): sequence bounds come from a (5, B) spans table (``spans_table``)
    # instead of the offsets; dK/dV are accumulated atomically in fp32 because sequences share or
    # overlap key rows; n_enc encodings are added to every Q tile as it is loaded
    spans: bool = False
    dkv_atomic: bool = False
    n_enc: int = 0

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
    named = dict(zip(("q_descale", "k_descale", "v_descale"), descales))
    checks.nonnegative_values(named, prefix="ads_gdpa: ", device=check_inputs_enabled())


def safe_offsets(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    checked: bool,
    zero_outside: torch.Tensor | None = None,
    host_q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets every kernel may trust to stay inside q/k/v and the outputs: int32 copies clamped
    on the device (``ads_kernel_tools.kernels.offsets``), unless host copies were validated against
    the tensors (``checked``: both sides had host offsets, ``host_q`` the queries'), which the caller
    promises equal the device ones. One small launch, no sync; self-attention offsets are clamped once.

    ``zero_outside``: a forward output with q's rows. Its rows before cu_q[0] and from cu_q[-1] on
    belong to no sequence, so no kernel writes them; they are zeroed here (in the clamp launch, or
    from the host copy's two bounds), instead of returning ``torch.empty``'s leftovers."""
    if checked:
        if zero_outside is not None:
            first, last = int(host_q[0]), int(host_q[-1])
            if first > 0:  # host-bound small calls: no slice or fill where the offsets span q
                zero_outside[:first].zero_()
            if last < zero_outside.shape[0]:
                zero_outside[last:].zero_()
        if cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32:
            return cu_q, cu_k
        return cu_q.to(torch.int32), (cu_q.to(torch.int32) if cu_k is cu_q else cu_k.to(torch.int32))
    from ads_kernel_tools.kernels.offsets import clamp_offsets

    return clamp_offsets(cu_q, q.shape[0], cu_k, k.shape[0], zero_outside=zero_outside)


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


def split_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused: int):
    """(q, k, v) as strided views of the fused tensors (``Fused``); no data is copied."""
    if fused == Fused.QKV:
        d = q.shape[-1] // 3
        return q[..., :d], q[..., d : 2 * d], q[..., 2 * d :]
    if fused == Fused.KV:
        d = k.shape[-1] // 2
        return q, k[..., :d], k[..., d:]
    return q, k, v


def num_sequences(
    cu_q: torch.Tensor, cu_k: torch.Tensor, kv_index, start_end: bool, broadcast_q: bool
) -> int:
    """B: query sequences (one per ad with ``kv_index``, one per start/end pair)."""
    if start_end:
        return cu_q.shape[0] // 2
    if kv_index is not None:
        return kv_index.shape[0]
    return cu_k.shape[0] - 1 if broadcast_q else cu_q.shape[0] - 1


def _pairs(t: torch.Tensor, start_end: bool) -> tuple[torch.Tensor, torch.Tensor]:
    t = t.to(torch.int64)
    return (t[0::2], t[1::2]) if start_end else (t[:-1], t[1:])


def spans_table(
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    kv_index: torch.Tensor | None,
    cu_o: torch.Tensor | None,
    start_end: bool,
    rows_q: int,
    rows_k: int,
    rows_o: int,
) -> torch.Tensor:
    """(5, B) int32 [q_start, q_end, k_start, k_end, o_start] per sequence, on the offsets' device,
    clamped so that no kernel can leave q, k/v or the output whatever the values (like
    ``safe_offsets``): spans into [0, rows], ends >= starts, kv_index into [0, R), and query spans cut
    so that their output rows [o_start, o_start + Lq) fit the output. A few small launches, no sync.

    Sequence b reads queries [q_start, q_end), keys [k_start, k_end) and writes output rows from
    o_start: ``start_end`` takes entries 2b, 2b+1 of the offsets (spans may overlap), else b, b+1;
    ``kv_index`` (upstream ad_to_request_offset) picks key sequence kv_index[b] of cu_k; ``cu_o``
    (upstream output_offset, entry 2b or b) defaults to the query start.
    """
    qs, qe = _pairs(cu_q, start_end)
    if kv_index is not None:
        n_req = cu_k.shape[0] - 1
        idx = kv_index.to(torch.int64).clamp(0, max(n_req - 1, 0))
        ck = cu_k.to(torch.int64)
        ks, ke = ck[idx], ck[idx + 1]
    else:
        ks, ke = _pairs(cu_k, start_end)
    qs = qs.clamp(0, rows_q)
    qe = torch.minimum(torch.maximum(qe, qs), torch.full_like(qe, rows_q))
    ks = ks.clamp(0, rows_k)
    ke = torch.minimum(torch.maximum(ke, ks), torch.full_like(ke, rows_k))
    os_ = qs if cu_o is None else _pairs(cu_o, start_end)[0].clamp(0, rows_o)
    qe = qs + torch.minimum(qe - qs, rows_o - os_)
    return torch.stack([qs, qe, ks, ke, os_]).to(torch.int32).contiguous()


def _host(t) -> np.ndarray | None:
    if t is None:
        return None
    return (
        t.detach().to("cpu", torch.int64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.int64)
    )


def check_spans(
    host_q,
    host_k,
    host_kv_index,
    host_o,
    has_kv_index: bool,
    start_end: bool,
    rows_q: int,
    rows_k: int,
    rows_o: int,
    max_k: int,
) -> tuple[list[int], list[int]] | None:
    """Value checks of the upstream span arguments where they are host data; returns the per-sequence
    (Lq, Lk) when every piece is known (exact FLOPs), else None. Raises ValueError naming the problem:
    a span outside its tensor or reversed, a key sequence longer than max_seqlen_k, kv_index out of
    range, output rows outside the output or shared by two sequences (their values would race)."""
    pre = "ads_gdpa: "
    hq, hk, hi, ho = _host(host_q), _host(host_k), _host(host_kv_index), _host(host_o)
    lq = lk = None
    if hq is not None:
        if start_end:
            qs, qe = hq[0::2], hq[1::2]
            bad = np.flatnonzero((qs < 0) | (qe < qs) | (qe > rows_q))
            if bad.size:
                b = int(bad[0])
                raise ValueError(
                    f"{pre}query_offset span {b} = [{int(qs[b])}, {int(qe[b])}) is not inside the "
                    f"{rows_q} query rows"
                )
            lq = qe - qs
        else:
            lq = validate_offsets("cu_seqlens_q", hq, rows_q, prefix=pre)
    if hk is not None:
        if start_end:
            ks, ke = hk[0::2], hk[1::2]
            bad = np.flatnonzero((ks < 0) | (ke < ks) | (ke > rows_k))
            if bad.size:
                b = int(bad[0])
                raise ValueError(
                    f"{pre}key_offset span {b} = [{int(ks[b])}, {int(ke[b])}) is not inside the "
                    f"{rows_k} key rows"
                )
            lk = ke - ks
            if lk.size and int(lk.max()) > max_k:
                b = int(np.argmax(lk))
                raise ValueError(f"{pre}key span {b} has {int(lk[b])} rows > max_seqlen_k={max_k}")
        else:
            lk = validate_offsets(
                "cu_seqlens_k", hk, rows_k, max_len=max_k, max_name="max_seqlen_k", prefix=pre
            )
    if hi is not None:
        n_req = (hk.shape[0] - 1) if hk is not None else None
        if hi.size and (int(hi.min()) < 0 or (n_req is not None and int(hi.max()) >= n_req)):
            b = int(np.argmax((hi < 0) | (hi >= (n_req if n_req is not None else 1 << 62))))
            raise ValueError(
                f"{pre}ad_to_request_offset[{b}] = {int(hi[b])} is not a key sequence index in [0, {n_req})"
            )
        lk = lk[hi] if lk is not None else None
    elif has_kv_index:
        lk = None  # per-request lengths known, but not which request each sequence reads
    if lq is not None:
        if ho is not None:
            os_ = ho[0::2] if start_end else ho[:-1]
        else:
            os_ = hq[0::2] if start_end else hq[:-1]
        oe = os_ + lq
        bad = np.flatnonzero((os_ < 0) | (oe > rows_o))
        if bad.size:
            b = int(bad[0])
            raise ValueError(
                f"{pre}output rows [{int(os_[b])}, {int(oe[b])}) of sequence {b} are outside the "
                f"{rows_o} output rows"
            )
        nz = np.flatnonzero(lq > 0)
        order = nz[np.argsort(os_[nz], kind="stable")]
        clash = np.flatnonzero(oe[order][:-1] > os_[order][1:])
        if clash.size:
            a, b = int(order[clash[0]]), int(order[clash[0] + 1])
            raise ValueError(
                f"{pre}sequences {a} and {b} write overlapping output rows ([{int(os_[a])}, "
                f"{int(oe[a])}) and [{int(os_[b])}, {int(oe[b])})): give each its own rows with output_offset"
            )
    if lq is None or lk is None:
        return None
    return [int(x) for x in lq], [int(x) for x in lk]


MAX_ENCODINGS = (
    5  # upstream's five tables: ts_encoding, ts_event_request_even/_log, ts_adjacent_event_log, pos_emb
)


@dataclass(frozen=True)
class Encodings:
    """Learned encodings added to the queries inside the kernels: tables[i] is (num_buckets, H, D)
    (one row per head) or (num_buckets, D) (shared by all heads), buckets[i] (Tq,) ints per query
    row; meta (3, 5) int64 on the device: bucket counts, row strides, head strides (0 if shared)."""

    tables: tuple[torch.Tensor, ...]
    buckets: tuple[torch.Tensor, ...]
    meta: torch.Tensor

    def kernel_args(self, dummy: torch.Tensor) -> tuple:
        """E0..E4, B0..B4, META for the kernels; unused slots take ``dummy``."""
        pad = MAX_ENCODINGS - len(self.tables)
        return (*self.tables, *([dummy] * pad), *self.buckets, *([dummy] * pad), self.meta)


_META_CACHE: dict = {}


def encodings(tables, buckets) -> Encodings | None:
    """``Encodings`` for the kernels (None when there are none); the metadata tensor is cached per
    shape, stride and device."""
    if not tables:
        return None
    key = tuple((t.shape[0], t.stride(0), t.stride(1) if t.dim() == 3 else 0) for t in tables)
    key = (key, str(tables[0].device))
    meta = _META_CACHE.get(key)
    if meta is None:
        cols = list(zip(*key[0])) if key[0] else [(), (), ()]
        rows = [list(c) + [0] * (MAX_ENCODINGS - len(c)) for c in cols]
        meta = _META_CACHE[key] = torch.tensor(rows, dtype=torch.int64, device=tables[0].device)
    return Encodings(tuple(tables), tuple(buckets), meta)


def encoding_grads(tables, buckets, dq32: torch.Tensor, deterministic: bool = False) -> list[torch.Tensor]:
    """d table = the scatter-add of dQ (fp32, (Tq, H, D)) over each table's buckets, summed over the
    heads for a shared (num_buckets, D) table; bucket values clamped into the table as the kernels
    clamp them. In the table's dtype. ``index_add_`` adds by atomics on a GPU, so rows sharing a
    bucket are summed in a varying order; ``deterministic`` takes ``index_put_(accumulate=True)``
    instead, which sorts the indices and adds each bucket's rows in one fixed order (the path
    PyTorch's own deterministic mode gives ``index_add_`` on CUDA)."""
    grads = []
    for t, bkt in zip(tables, buckets):
        idx = bkt.to(torch.int64).clamp(0, t.shape[0] - 1)
        src = dq32 if t.dim() == 3 else dq32.sum(1)
        g = torch.zeros(t.shape, dtype=torch.float32, device=t.device)
        g = g.index_put_((idx,), src, accumulate=True) if deterministic else g.index_add_(0, idx, src)
        grads.append(g.to(t.dtype))
    return grads


def check_buckets(tables, buckets, read_device: bool) -> None:
    """ValueError when a bucket value falls outside its table, for host (CPU) buckets, or device
    ones when ``read_device`` (ADS_CHECK_INPUTS, one sync each); the kernels clamp them anyway."""
    for i, (t, bkt) in enumerate(zip(tables, buckets)):
        if bkt.device.type != "cpu" and not read_device:
            continue
        if bkt.numel() == 0:
            continue
        lo, hi = int(bkt.min()), int(bkt.max())
        if lo < 0 or hi >= t.shape[0]:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"ads_gdpa: encodings[{i}] bucket value {bad} is outside its table of {t.shape[0]} buckets"
            )
