import json

import pytest
import torch

from ads_kernel_tools.bench import Report, Row, flops, peers, time_fn


def test_valid_pairs_against_brute_force():
    def brute(lq, lk, causal=False, window=None, sym=None):
        n = 0
        for i in range(lq):
            d = i + lk - lq
            for j in range(lk):
                ok = True
                if sym is not None:
                    ok &= abs(i - j) <= sym
                if causal:
                    ok &= j <= d
                if window is not None:
                    left, right = window
                    ok &= left is None or j >= d - left
                    ok &= right is None or j <= d + right
                n += ok
        return n

    for lq, lk in [(5, 5), (3, 7), (7, 3), (1, 1), (0, 4)]:
        assert flops.valid_pairs(lq, lk) == lq * lk
        assert flops.valid_pairs(lq, lk, causal=True) == brute(lq, lk, causal=True)
        assert flops.valid_pairs(lq, lk, window=(2, 1)) == brute(lq, lk, window=(2, 1))
        assert flops.valid_pairs(lq, lk, window=(None, 0)) == brute(lq, lk, causal=True)
        assert flops.valid_pairs(lq, lk, symmetric_window=1) == brute(lq, lk, sym=1)


def test_attention_flops_match_spec_formula():
    lens = [3, 10, 7]
    # 4·H·D·Σ L² for self-attention with d_qk = d_v
    assert flops.attention_fwd(lens, lens, 4, 128) == 4 * 4 * 128 * sum(x * x for x in lens)
    assert flops.attention_bwd(lens, lens, 4, 128) == 2.5 * flops.attention_fwd(lens, lens, 4, 128)
    # short-KV cross attention: every query sees 256 keys; d_v differs from d_qk
    assert flops.attention_fwd([5, 6], 256, 2, 192, 128) == 2 * 2 * (192 + 128) * 256 * 11
    causal = flops.attention_fwd([4], [4], 1, 8, causal=True)
    assert causal == 2 * 1 * 16 * 10  # 10 pairs in a 4×4 lower triangle
    with pytest.raises(ValueError):
        flops.attention_fwd([1, 2], [1, 2, 3], 1, 8)


def test_block_flops_bytes_and_rates():
    assert flops.block_attention_fwd([64, 10], 2, 128) == 4 * 2 * 128 * 64 * 74
    t = torch.empty(10, 4, dtype=torch.bfloat16)
    assert flops.tensor_bytes(t, t) == 160
    assert flops.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert flops.gbps(4e9, 2.0) == pytest.approx(2000.0)
    assert flops.gemm(2, 3, 4) == 48


def test_time_fn_passes_rotating_index_and_reports_median():
    seen = []
    res = time_fn(lambda i: seen.append(i), rep_ms=5, max_reps=20)
    assert res["n"] >= 1 and res["p20"] <= res["ms"] <= res["p80"]
    assert seen == list(range(len(seen))) and len(seen) >= 3  # one counter over every call
    calls = []
    time_fn(lambda: calls.append(1), rep_ms=1, max_reps=3)
    assert len(calls) >= 2


def test_report_ratio_table_json_plot(tmp_path):
    rep = Report("demo", ours="ours")
    for x, ours, peer in [(256, 10.0, 5.0), (512, 30.0, 40.0)]:
        rep.add(Row("gdpa", "ours", "fwd", f"L={x}", 1.0, tflops=ours, extra={"L": x}))
        rep.add(Row("gdpa", "cudnn", "fwd", f"L={x}", 1.0, tflops=peer, extra={"L": x}))
        rep.add(Row("gdpa", "fa4", "fwd", f"L={x}", None, note="unavailable", extra={"L": x}))
    text = rep.table()
    assert "x best peer" in text and "2.00" in text and "0.75" in text
    data = json.loads(rep.write_json(tmp_path / "r.json").read_text())
    assert data["rows"][0]["ratio"] == pytest.approx(2.0)
    assert data["environment"]["torch"] == torch.__version__
    pytest.importorskip("matplotlib")
    png = rep.plot_png(tmp_path / "r.png", x_key="L")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        Report("x", metric="ms")


def test_peers_report_missing_instead_of_raising(capsys):
    assert peers.sdpa("math") is not None
    with pytest.raises(ValueError):
        peers.sdpa("bogus")
    mod = peers._optional("surely_not_a_module_xyz", "ghost")
    assert mod is None and "ghost" in peers.notes()
    with peers.skip_on_error("boom"):
        raise RuntimeError("unsupported shape")
    assert "unsupported shape" in peers.notes()["boom"]
    q = torch.randn(1, 2, 8, 16)
    out = peers.sdpa("math")(q, q, q)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_compiled_peer_allows_repeated_backward_over_one_graph(monkeypatch):
    """Benchmarks call the backward again and again on a retained graph; buffer donation forbids it."""
    import torch._functorch.config as functorch_config

    monkeypatch.setattr(functorch_config, "donated_buffer", True)
    peers.compiled(lambda x: x * 2)
    assert functorch_config.donated_buffer is False


def test_demo_reports_agreement_and_mismatch(capsys):
    from ads_kernel_tools.bench import DemoCase, run_demo

    ref = torch.linspace(-1, 1, 11)
    good = DemoCase("good", lambda: (ref + 1e-4, ref, ref + 1e-4))
    bad = DemoCase("bad", lambda: (ref + 1.0, ref, ref + 1e-4))
    assert run_demo("demo", [good]) == 0
    assert run_demo("demo", [good, bad]) == 1
    text = capsys.readouterr().out
    assert "1/2 ops agree" in text and "MISMATCH" in text and "good" in text


def test_cli_parser_has_the_flags_ci_bench_relies_on(capsys):
    from ads_kernel_tools.bench import cli

    args = cli.parser("prog", "demo").parse_args(["--quick", "--json", "a.json", "--plot", "a.png"])
    assert args.quick and args.json == "a.json" and args.plot == "a.png" and not args.demo
    assert cli.parser("prog", "demo").parse_args(["--demo"]).demo
    if not torch.cuda.is_available():
        assert cli.gpu_present("prog") is False
        assert "needs a CUDA GPU" in capsys.readouterr().out


def test_report_progress_prints_each_row_as_it_lands(capsys):
    quiet, live = Report("q"), Report("l", progress=True)
    quiet.add(Row("gdpa", "ours", "fwd", "L=1", 1.0, tflops=12.34))
    assert capsys.readouterr().out == ""
    live.add(Row("gdpa", "ours", "fwd", "L=1", 1.0, tflops=12.34))
    live.add(Row("gdpa", "fa4", "fwd", "L=1", None, note="unavailable"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["  . gdpa fwd L=1 ours: 12.3 tflops", "  . gdpa fwd L=1 fa4: - tflops"]
