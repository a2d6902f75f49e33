"""scripts/plot.py renders both pictures from the committed benchmark JSON, computes the roofline
coordinates the way the bench does, and refuses inputs it cannot draw with a clear message."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "plot.py"
RESULTS = ROOT / "bench" / "results"
BENCH = RESULTS / "2026-11-29_h200_b384342_bench.json"
PEERS = RESULTS / "2026-11-30_h200_peers.json"
SIMULATE = RESULTS / "2026-11-29_h200_b384342_simulate-cuda-nodefrag.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plot_module():
    spec = importlib.util.spec_from_file_location("treemla_plot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300
    )


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_roofline_with_peers(tmp_path):
    out = tmp_path / "roofline.png"
    res = run("roofline", BENCH, "--peers", PEERS, "-o", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    width, height = png_size(out)
    assert width > 800 and height > 500


def test_fragmentation(tmp_path):
    out = tmp_path / "frag.png"
    res = run("fragmentation", SIMULATE, "-o", out)
    assert res.returncode == 0, res.stderr
    width, height = png_size(out)
    assert width > 800 and height > 400


def test_default_output_name(tmp_path):
    bench = tmp_path / "run_bench.json"
    bench.write_text(BENCH.read_text())
    res = run("roofline", bench)
    assert res.returncode == 0, res.stderr
    png_size(tmp_path / "run_bench_roofline.png")


def test_roofline_coordinates_match_the_bench():
    # The bench JSON carries its own TFLOP/s; the picture's formula must give the same numbers.
    plot = plot_module()
    bench = json.loads(BENCH.read_text())
    for case in bench["results"]:
        intensity, tflops = plot.case_point(case, "case")
        assert tflops == pytest.approx(case["tflops"], rel=2e-3)
        assert intensity == pytest.approx(2 * case["heads"] * case["q_len"] * 1088 / 1152)
    # The peers' figures were recorded with their TFLOP/s: 760 us at B=1 H=8 q=65 L=131072 is 195.
    x, y = plot.case_point(
        {"batch": 1, "heads": 8, "q_len": 65, "prefix": 131072, "page_size": 64, "us": 760}, "peer"
    )
    assert y == pytest.approx(195, rel=5e-3)


def test_bad_inputs_are_named(tmp_path):
    no_frag = json.loads(SIMULATE.read_text())
    no_frag["fragmentation"] = None  # what a CPU run writes
    (tmp_path / "cpu.json").write_text(json.dumps(no_frag))
    res = run("fragmentation", tmp_path / "cpu.json", "-o", tmp_path / "x.png")
    assert (
        res.returncode == 2
        and "has no fragmentation table" in res.stderr
        and "--device cuda" in res.stderr
    )
    assert not (tmp_path / "x.png").exists()

    (tmp_path / "peers.json").write_text(
        json.dumps(
            [{"impl": "x", "batch": 1, "heads": 8, "q_len": 65, "prefix": 1024, "page_size": 64}]
        )
    )
    res = run("roofline", BENCH, "--peers", tmp_path / "peers.json", "-o", tmp_path / "x.png")
    assert res.returncode == 2 and "peers[0] has no 'us'" in res.stderr

    bench = json.loads(BENCH.read_text())
    del bench["hbm_read_gbps"]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    res = run("roofline", tmp_path / "bench.json", "-o", tmp_path / "x.png")
    assert res.returncode == 2 and "has no 'hbm_read_gbps'" in res.stderr

    (tmp_path / "broken.json").write_text("{")
    res = run("roofline", tmp_path / "broken.json")
    assert res.returncode == 2 and "not valid JSON" in res.stderr
    res = run("roofline", tmp_path / "missing.json")
    assert res.returncode == 2 and "cannot be read" in res.stderr
