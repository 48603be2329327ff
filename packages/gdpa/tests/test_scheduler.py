"""Host tile maps, config fitting and the config knobs (pure CPU, no kernels)."""

import torch

from ads_gdpa import config as cfg
from ads_gdpa.scheduler import tile_map


def test_tile_map_covers_every_tile_sorted_by_work():
    rows, work = [130, 0, 5, 300], [10, 7, 400, 300]
    m = tile_map(rows, work, heads=2, block=128, programs=None, device=torch.device("cpu"))
    tiles = {(int(b), int(h), int(t)) for b, h, t in m.T.tolist()}
    expected = {(b, h, t) for b, r in enumerate(rows) for h in range(2) for t in range((r + 127) // 128)}
    assert tiles == expected and m.shape[1] == len(expected)
    w = [work[b] for b in m[0].tolist()]
    assert w == sorted(w, reverse=True)


def test_zigzag_balances_programs():
    rows, work = [128] * 10, list(range(10, 0, -1))
    m = tile_map(rows, work, heads=1, block=128, programs=4, device=torch.device("cpu"))
    per_prog = [0] * 4
    for slot, b in enumerate(m[0].tolist()):
        per_prog[slot % 4] += work[b]
    assert sorted(m[0].tolist()) == list(range(10))
    assert max(per_prog) - min(per_prog) <= max(work)


def test_fit_respects_shared_memory():
    space, pinned = cfg.fit(cfg.BWD_SPACE, cfg.BWD_PINNED_GPU, cfg.bwd_smem, 256, 128)
    assert space and all(cfg.bwd_smem(c, 256, 128) <= cfg.SMEM_LIMIT for c in space)
    assert cfg.bwd_smem(pinned, 256, 128) <= cfg.SMEM_LIMIT
    big = cfg.TileConfig(256, 256, 8, 4)
    huge, _ = cfg.fit([big], big, cfg.fwd_smem, 256, 256)
    assert cfg.fwd_smem(huge[0], 256, 256) <= cfg.SMEM_LIMIT


def test_gluon_forward_knobs(monkeypatch):
    """The dead-half build is chosen by max_seqlen_q unless ADS_GDPA_SKIP_DEAD says otherwise; the
    deferred scale is on unless ADS_GDPA_DEFER_SCALE=0."""
    monkeypatch.delenv("ADS_GDPA_SKIP_DEAD", raising=False)
    monkeypatch.delenv("ADS_GDPA_DEFER_SCALE", raising=False)
    limit = cfg.SKIP_DEAD_MAX_Q
    assert cfg.skip_dead_halves(limit) and not cfg.skip_dead_halves(limit + 1)
    assert cfg.defer_scale()
    monkeypatch.setenv("ADS_GDPA_SKIP_DEAD", "0")
    assert not cfg.skip_dead_halves(1)
    monkeypatch.setenv("ADS_GDPA_SKIP_DEAD", "1")
    assert cfg.skip_dead_halves(1 << 20)
    monkeypatch.setenv("ADS_GDPA_DEFER_SCALE", "0")
    assert not cfg.defer_scale()
