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
    assert "x best peer" in text and "2.00" in text and "0.75" in text and "best peer" in text
    data = json.loads(rep.write_json(tmp_path / "r.json").read_text())
    assert data["rows"][0]["ratio"] == pytest.approx(2.0) and data["rows"][0]["best_peer"] == "cudnn"
    assert data["rows"][1]["ratio"] == pytest.approx(1.0)  # the best peer's own row
    assert data["environment"]["torch"] == torch.__version__
    assert data["metric"] == "tflops" and data["ours"] == "ours"
    pytest.importorskip("matplotlib")
    png = rep.plot_png(tmp_path / "r.png", x_key="L")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        Report("x", metric="ms")


def _sweep_report() -> Report:
    """Two modes, two line families told apart by extra["D"], one single-x family, an absent peer."""
    rep = Report("suite: demo")
    for d in (64, 128):
        for n in (256, 512, 1024):
            shape = f"B=8 D={d} max={n}"
            for mode, scale in (("fwd", 1.0), ("bwd", 0.7)):
                extra = {"D": d, "max_len": n}
                rep.add(Row("self", "ours", mode, shape, 1.0, tflops=scale * n, extra=dict(extra)))
                rep.add(
                    Row("self", "ours[triton]", mode, shape, 1.0, tflops=scale * n / 2, extra=dict(extra))
                )
                peer = None if (n == 1024 and mode == "bwd") else scale * 400
                rep.add(
                    Row("self", "fa4", mode, shape, None if peer is None else 1.0, tflops=peer, extra=extra)
                )
    for mode in ("fwd", "bwd"):
        rep.add(Row("dense", "ours", mode, "B=4 max=4096", 1.0, tflops=600.0, extra={"max_len": 4096}))
        rep.add(Row("dense", "fa4", mode, "B=4 max=4096", 1.0, tflops=640.0, extra={"max_len": 4096}))
    return rep


def test_markdown_one_table_per_op_with_ratio_and_missing_cells():
    md = _sweep_report().markdown()
    assert "| shape | ours | ours[triton] | fa4 | ours / best peer |" in md
    assert "| shape | ours | fa4 | ours / best peer |" in md  # dense: only the providers it has
    assert "**self** (B=8): TFLOP/s, fwd / bwd" in md
    assert "| D=64 max=256 | 256 / 179 | 128 / 90 | 400 / 280 | 0.64 / 0.64 |" in md
    assert "| D=64 max=1024 | 1024 / 717 | 512 / 358 | 400 / — | 2.56 / — |" in md  # no peer: no ratio
    assert "| B=4 max=4096 | 600 / 600 | 640 / 640 | 0.94 / 0.94 |" in md  # one shape: labelled in full
    kept = _sweep_report().markdown(providers=["fa4"])
    assert "ours[triton]" not in kept and "| shape | ours | fa4 |" in kept


def test_saved_report_rerenders_with_its_own_environment(tmp_path):
    rep = _sweep_report()
    rep.env = {"gpu": "NVIDIA H200", "sm": "9.0", "sms": 132, "date": "2026-11-30", "torch": "2.11",
               "triton": "3.6.0", "clocks_mhz": "1980, 1980, 3201", "git_sha": "abc1234",
               "peers": {"flash-attn-4": "4.0.0b36"}}  # fmt: skip
    path = rep.write_json(tmp_path / "docs" / "bench.json")
    back = Report.load(path)
    assert back.markdown() == rep.markdown()
    head = back.markdown().splitlines()[2]
    for part in (
        "2026-11-30",
        "H200 (sm_90, 132 SMs)",
        "1980, 1980, 3201 MHz",
        "flash-attn-4 4.0.0b36",
        "abc1234",
    ):
        assert part in head
    # older files: no metric saved (GB/s rows say it), unknown keys ignored
    data = {"title": "t", "rows": [{"op": "a", "provider": "ours", "mode": "fwd", "shape": "s", "ms": 1.0,
                                    "gbps": 3.0, "future_key": 1}]}  # fmt: skip
    old = Report.from_dict(data)
    assert old.metric == "gbps" and old.rows[0].gbps == 3.0


def test_combined_table_names_suite_provider_and_best_peer(tmp_path):
    from ads_kernel_tools.bench.report import combined_table

    a = _sweep_report().write_json(tmp_path / "pkg_a" / "docs" / "bench.json")
    b = Report("b", metric="gbps")
    b.add(Row("copy", "torch", "d2d", "1 GiB", None, gbps=4000.0))
    b.add(Row("blk", "ours", "fwd", "T=9", 0.5, gbps=4200.0))
    b.add(Row("blk", "cudnn", "fwd", "T=9", 1.0, gbps=2100.0))
    b = b.write_json(tmp_path / "out" / "blk.json")
    lines = combined_table([Report.load(a), Report.load(b)]).splitlines()
    head = next(line for line in lines if line.startswith("suite"))
    assert head.split() == ["suite", "op", "mode", "shape", "provider", "ms", "TFLOP/s", "GB/s", "x", "best",
                            "peer", "best", "peer"]  # fmt: skip
    row = next(line for line in lines if "*ours " in line and "blk" in line).split()
    assert row[0] == "blk" and row[-2:] == ["2.00", "cudnn"]
    assert any(line.split()[0] == "pkg_a" and "*ours[triton]" in line for line in lines)
    assert any(" fa4 " in line and "1.00" in line for line in lines)  # peers are rows too


def test_cli_renders_markdown_into_markers_and_plots(tmp_path, capsys):
    from ads_kernel_tools.bench.report import main

    path = _sweep_report().write_json(tmp_path / "r.json")
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# x\n<!-- bench-tables:begin -->\nold\n<!-- bench-tables:end -->\ntail\n")
    assert main([str(path), "--into", str(md), "--combine"]) == 0
    text = md.read_text()
    assert "old" not in text and text.endswith("<!-- bench-tables:end -->\ntail\n") and "**dense**" in text
    assert "*ours" in capsys.readouterr().out
    md.write_text("no markers")
    with pytest.raises(ValueError, match="bench-tables"):
        main([str(path), "--into", str(md)])
    assert main([str(tmp_path / "absent.json")]) == 1
    pytest.importorskip("matplotlib")
    assert main([str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_layout_families_modes_and_bars(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from ads_kernel_tools.bench.plot import _layout, _series

    rep = _sweep_report()
    grid, ncols = _layout(_series(rep.rows, "max_len", "tflops"), "max_len")
    assert ncols == 2 and len(grid) == 3  # D=64 and D=128 lines, then dense bars; fwd | bwd
    assert [c[0] for c in grid[0]] == ["self, D=64 · fwd", "self, D=64 · bwd"]
    assert grid[2][0][1] == "bars" and grid[2][0][0] == "dense · fwd (max_len = 4096)"
    # a shape parameter missing from extra would zig-zag one line: the repeat becomes its own series
    dup = [Row("op", "ours", "fwd", f"s{i}", 1.0, tflops=float(i), extra={"x": 1}) for i in range(2)]
    assert sorted(_series(dup, "x", "tflops")[(("op", ()), "fwd")]) == ["ours", "ours #2"]
    png = rep.plot_png(tmp_path / "p.png", "max_len")
    width, height = Image.open(png).size
    assert 1200 <= width <= 1600 and height < 1600
    one_mode = Report("m")
    for d in (1, 2, 3, 4):
        one_mode.add(Row("op", "ours", "fwd", f"d{d}", 1.0, tflops=1.0, extra={"d": d, "x": 1}))
        one_mode.add(Row("op", "ours", "fwd", f"d{d}b", 1.0, tflops=2.0, extra={"d": d, "x": 2}))
    grid, ncols = _layout(_series(one_mode.rows, "x", "tflops"), "x")
    assert ncols == 3 and [len([c for c in r if c]) for r in grid] == [3, 1]


def test_cli_save_writes_json_and_plot(tmp_path, capsys):
    from ads_kernel_tools.bench import cli

    args = cli.parser("p", "d").parse_args(
        ["--json", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png")]
    )
    cli.save(_sweep_report(), args, x_key="max_len")
    assert Report.load(tmp_path / "a.json").rows and "--markdown" in capsys.readouterr().out


def test_cli_finish_prints_table_notes_summary_then_saves(tmp_path, monkeypatch, capsys):
    from ads_kernel_tools.bench import cli

    monkeypatch.setattr(peers, "_NOTES", {"ghost": "not installed"})
    args = cli.parser("p", "d").parse_args(["--json", str(tmp_path / "a.json")])
    seen = []
    assert cli.finish(_sweep_report(), args, x_key="max_len", summary=seen.append) == 0
    out = capsys.readouterr().out
    assert len(seen) == 1 and "note: ghost: not installed" in out
    assert out.index("note: ghost") < out.index("wrote ") and Report.load(tmp_path / "a.json").rows


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


def test_cli_main_routes_demo_flags_and_measure(monkeypatch, capsys):
    from ads_kernel_tools.bench import cli

    seen = []
    kw = dict(demo=lambda: 7, flags={"--sweep": "only the sweep"})
    assert cli.main("prog", "d", lambda a: seen.append(a), argv=["--demo"], **kw) == 7 and not seen
    monkeypatch.setattr(cli, "gpu_present", lambda prog: False)
    assert cli.main("prog", "d", lambda a: seen.append(a), argv=["--quick"], **kw) == 0 and not seen
    monkeypatch.setattr(cli, "gpu_present", lambda prog: True)
    assert cli.main("prog", "d", lambda a: seen.append(a), argv=["--sweep", "--quick"], **kw) == 0
    assert seen[0].sweep and seen[0].quick and not seen[0].demo
    assert cli.main("prog", "d", lambda a: 3, argv=[], **kw) == 3


def test_report_progress_prints_each_row_as_it_lands(capsys):
    quiet, live = Report("q"), Report("l", progress=True)
    quiet.add(Row("gdpa", "ours", "fwd", "L=1", 1.0, tflops=12.34))
    assert capsys.readouterr().out == ""
    live.add(Row("gdpa", "ours", "fwd", "L=1", 1.0, tflops=12.34))
    live.add(Row("gdpa", "fa4", "fwd", "L=1", None, note="unavailable"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["  . gdpa fwd L=1 ours: 12.3 tflops", "  . gdpa fwd L=1 fa4: - tflops"]


def test_time_fn_leaves_default_bound_arguments_alone():
    """``lambda fn=fn: fn()`` binds a loop variable; the counter must not replace it."""
    calls = []

    def work():
        calls.append(1)

    time_fn(lambda fn=work: fn(), rep_ms=1.0, max_reps=3)
    seen = []
    time_fn(lambda i, tag="x": seen.append((i, tag)), rep_ms=1.0, max_reps=3)
    assert calls and all(isinstance(i, int) and tag == "x" for i, tag in seen)
