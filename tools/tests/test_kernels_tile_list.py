"""Device-built tile lists (``kernels.tile_list``): contents, order, count, and the balance they buy.

Runs the two small Triton kernels on the GPU, or through the interpreter on CPU.
"""

import math

import pytest
import torch

from ads_kernel_tools.kernels.tile_list import tile_list
from ads_kernel_tools.testing import jagged_lengths, lengths_to_offsets


def _expected(order, lens, block, slots, heads):
    out = []
    for b in order:
        tiles = min(math.ceil(lens[b] / block), slots)
        out += [(b * heads + h) * slots + t for h in range(heads) for t in range(tiles)]
    return out


def _run(lens, order, block, slots, heads, device):
    cu = lengths_to_offsets(lens, device=device)
    order_t = torch.tensor(order, dtype=torch.int32, device=device)
    entries, count = tile_list(order_t, cu, block, slots, heads)
    assert count.shape == (1,) and count.dtype == torch.int32 and count.device == order_t.device
    n = int(count)
    assert entries.numel() >= n
    return entries[:n].tolist()


@pytest.mark.parametrize("heads", [1, 3])
def test_lists_every_real_tile_in_the_given_order(device, heads):
    # 0, 1, block-1, block, block+1 and a sequence longer than the slot cap (4 x 64 rows)
    lens = [0, 1, 63, 64, 65, 300, 129, 0]
    order = [5, 2, 0, 6, 1, 4, 3, 7]
    got = _run(lens, order, block=64, slots=4, heads=heads, device=device)
    assert got == _expected(order, lens, 64, 4, heads)


def test_count_carries_across_scan_chunks(device):
    # more sequences than one chunk of the counting scan (1024)
    lens = [(i * 37) % 200 for i in range(1100)]
    order = list(range(1099, -1, -1))
    got = _run(lens, order, block=64, slots=3, heads=2, device=device)
    assert got == _expected(order, lens, 64, 3, 2)


def test_empty_batch_and_no_rows(device):
    assert _run([0, 0, 0], [0, 1, 2], block=128, slots=1, heads=4, device=device) == []
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    entries, count = tile_list(torch.zeros(0, dtype=torch.int32, device=device), cu, 128, 1, 4)
    assert int(count) == 0


def test_striding_the_list_balances_programs(device):
    """The reason for the list: at sparsity 0.5 (lengths uniform on [1, 2048]), 132 programs striding
    the old virtual grid (16 slots per sequence and head) carried up to 13 % more than the mean; over
    the list every program is within 2 % of it."""
    lens = jagged_lengths(1152, 2048, 0.5, seed=2048)
    order = sorted(range(len(lens)), key=lambda b: -lens[b])
    block, slots, heads, programs = 128, 16, 4, 132
    steps = {b: math.ceil(lens[b] / block) + 1 for b in range(len(lens))}  # kv steps + a tile's overhead

    def imbalance(tiles):
        load = [sum(steps[t // (heads * slots)] for t in tiles[p::programs]) for p in range(programs)]
        return max(load) / (sum(load) / programs)

    virtual = [(b * heads + h) * slots + t for b in order for h in range(heads) for t in range(slots)]
    virtual = [t if (t % slots) * block < lens[t // (heads * slots)] else None for t in virtual]
    old = [[t for t in virtual[p::programs] if t is not None] for p in range(programs)]
    old_load = [sum(steps[t // (heads * slots)] for t in ts) for ts in old]
    assert max(old_load) / (sum(old_load) / programs) > 1.10  # the aliasing this list removes
    assert imbalance(_run(lens, order, block, slots, heads, device)) < 1.02


def _schedule_expected(lq, lk, max_q, tile_q, block, slots, heads):
    work = [min(a, max_q) * (c if tile_q else (c > 0)) for a, c in zip(lq, lk)]
    order = sorted(range(len(lq)), key=lambda b: (-work[b], b))  # stable, heaviest first
    return _expected(order, lq if tile_q else lk, block, slots, heads)


@pytest.mark.parametrize("tile_q", [True, False])
# one program sorts and writes the list; one sorts, a grid writes; the torch.argsort fallback
@pytest.mark.parametrize("sort_max, fill_max", [(4096, 2**18), (4096, 0), (2, 2**18)])
def test_schedule_orders_by_work_and_lists_real_tiles(device, monkeypatch, tile_q, sort_max, fill_max):
    from ads_kernel_tools.kernels import tile_list as tl_mod

    monkeypatch.setattr(tl_mod, "SORT_MAX", sort_max)
    monkeypatch.setattr(tl_mod, "FILL_MAX", fill_max)
    # ties (equal work), Lq = 0, Lk = 0, Lq past max_q, lengths around the block
    lq = [65, 0, 300, 64, 1, 65, 129, 500, 7]
    lk = [10, 5, 0, 63, 129, 10, 300, 2, 64]
    max_q, block, slots, heads = 200, 64, 4, 2
    cu_q, cu_k = lengths_to_offsets(lq, device=device), lengths_to_offsets(lk, device=device)
    entries, count = tl_mod.schedule(cu_q, cu_k, max_q, tile_q=tile_q, block=block, slots=slots, heads=heads)
    got = entries[: int(count)].tolist()
    assert got == _schedule_expected(lq, lk, max_q, tile_q, block, slots, heads)


@pytest.mark.parametrize("fill_max", [2**18, 0])
@pytest.mark.parametrize("lens", [[300], [0], [5, 0]])
def test_schedule_of_one_or_two_sequences(device, monkeypatch, lens, fill_max):
    from ads_kernel_tools.kernels import tile_list as tl_mod

    monkeypatch.setattr(tl_mod, "FILL_MAX", fill_max)
    cu = lengths_to_offsets(lens, device=device)
    entries, count = tl_mod.schedule(cu, cu, 512, tile_q=True, block=128, slots=4, heads=3)
    assert entries[: int(count)].tolist() == _schedule_expected(lens, lens, 512, True, 128, 4, 3)
