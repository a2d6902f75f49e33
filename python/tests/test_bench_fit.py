"""scripts/bench-fit.py fits call time against prefix length per family and shape, from treemla
bench's JSON or printed table and bench/peers.py JSON: checked on small files written here, and on the committed
measurements of the sixteenth session, whose fit docs/verify-kernel.md quotes."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-fit.py"
RESULTS = ROOT / "bench" / "results"


@pytest.fixture(scope="module")
def bench_fit(load_script):
    return load_script("bench-fit.py")


def bench_doc(rows):
    return {"gpu": "test", "results": [
        {"family": f, "tile": "smem-large", "batch": 1, "heads": 16, "q_len": 16, "prefix": L,
         "page_size": 64, "us": us} for f, L, us in rows]}


def run(*args):
    p = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_exact_line_and_median_of_repeats(bench_fit, tmp_path):
    # us = 20 + 0.001 L exactly; L = 2048 measured three times (median 22.048), one outlier
    rows = [("sm90a", 1024, 21.024), ("sm90a", 2048, 22.048), ("sm90a", 2048, 22.048),
            ("sm90a", 2048, 99.0), ("sm90a", 4096, 24.096), ("warpspec", 4096, 50.0)]
    found = bench_fit.fits(bench_fit.rows_of(write(tmp_path / "a.json", bench_doc(rows))))
    assert list(found) == [("sm90a", "smem-large", 1, 16, 16, 64)]  # warpspec: one length only
    points, fixed, per_key = found[("sm90a", "smem-large", 1, 16, 16, 64)]
    assert points == [(1024, 21.024), (2048, 22.048), (4096, 24.096)]
    assert fixed == pytest.approx(20.0)
    assert per_key == pytest.approx(0.001)


def test_peers_and_bench_files_pool_and_print(tmp_path):
    bench = write(tmp_path / "b.json", bench_doc([("sm90a", 32768, 70.0), ("sm90a", 65536, 102.0)]))
    peers = write(tmp_path / "p.json", [
        {"impl": "fa3", "batch": 1, "heads": 16, "q_len": 16, "prefix": L, "page_size": 64, "us": us}
        for L, us in ((32768, 46.0), (131072, 135.0))])
    rc, out, err = run(bench, peers)
    assert rc == 0, err
    lines = [l for l in out.splitlines() if l.startswith("| fa3") or l.startswith("| sm90a")]
    assert len(lines) == 2
    assert "| 1.000 | 38.0 |" in lines[1]  # sm90a: 32 us per 32768 keys, 70 - 32 at L = 0


def test_bad_inputs_are_refused_with_a_message(tmp_path):
    rc, out, err = run(write(tmp_path / "one.json", bench_doc([("sm90a", 1024, 5.0)])))
    assert rc == 2 and "two or more prefix lengths" in err
    rc, out, err = run(write(tmp_path / "other.json", {"foo": 1}))
    assert rc == 2 and "neither treemla bench" in err
    (tmp_path / "notes.txt").write_text("no table here\n")
    rc, out, err = run(tmp_path / "notes.txt")
    assert rc == 2 and "no row of treemla bench's table" in err
    rc, out, err = run(tmp_path / "missing.json")
    assert rc == 2 and "missing.json" in err


@pytest.mark.parametrize("name, row_start, row_end", [
    # docs/verify-kernel.md, "The fixed cost of a split call": fa3 at 1,16,16, 0.91 us per 1,024
    # keys and 18 us at L = 0 (the sixteenth session's call 3, peers JSON), and sm90a (757d91c)
    # there, 0.99 us and 39 us (call 1, the table treemla bench printed)
    ("2026-12-02_h200_s16-call3_fa3-prefix-sweep_peers.json", "| fa3 | - | 1 | 16 | 16 | 64 |",
     "| 0.912 | 18.4 |"),
    ("2026-12-02_h200_s16-call1_sm90a-prefix-sweep.txt",
     "| sm90a | smem-large | 1 | 16 | 16 | 64 |", "| 0.991 | 39.0 |"),
])
def test_the_committed_sweeps_give_the_documented_fit(name, row_start, row_end):
    rc, out, err = run(RESULTS / name)
    assert rc == 0, err
    row = next(l for l in out.splitlines() if l.startswith(row_start))
    assert row.endswith(row_end), row


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path
