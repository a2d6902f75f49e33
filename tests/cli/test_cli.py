#!/usr/bin/env python3
"""Tests of the `treemla` command-line tool, run as a process the way a user runs it.

CTest runs each test class below as one test (tests/CMakeLists.txt). By hand:

    python3 tests/cli/test_cli.py --treemla build/treemla            # every class
    python3 tests/cli/test_cli.py --treemla build/treemla BadOptions # one class

The tests pass with a CPU-only build and with a CUDA build on a machine without a GPU; the
tests that need the absence of a GPU skip where `treemla info` lists one.
"""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import unittest

TREEMLA = None  # path of the binary, from --treemla or $TREEMLA_BIN

# Small enough that a run takes well under a second.
QUICK = ["--rounds", "4", "--prompt-max", "64", "--gen-max", "32"]

# The keys `treemla simulate --json` writes (docs/tool.md lists them).
SIMULATE_KEYS = {
    "config", "wall_seconds", "tree_nodes", "requests", "tokens_committed", "request_rounds",
    "mean_acceptance", "verify", "defrags", "checks", "trace", "gpu", "fragmentation", "cost_model",
}
SIMULATE_NESTED_KEYS = {
    "config": {"device", "seed", "rounds", "heads", "budget", "depth", "top_k", "page_size",
               "num_pages", "max_requests", "prompt_min", "prompt_max", "gen_min", "gen_max",
               "policy", "defrag_threshold", "defrag_max_moves", "accept_prob", "check_every",
               "check_max_context", "budget_mode", "target", "draft_logit_range"},
    "requests": {"admitted", "finished", "cut_short", "live_at_end", "admission_deferrals"},
    "verify": {"calls", "wall_seconds", "flops"},
    "defrags": {"runs", "skipped", "pages_relocated", "page_moves"},
    "checks": {"passed", "rows_checked", "row_mismatches", "nonfinite_outputs",
               "commit_plan_mismatches", "cross_checks", "cross_checks_skipped",
               "cross_check_failures", "cross_check_max_diff", "accept_mismatches",
               "layout_mismatches"},
}

# `cost_model` of `simulate --json` with a cost table, and its `table`.
COST_MODEL_KEYS = {
    "table", "layers", "round_fixed_us", "round_per_node_us", "budget_candidates",
    "calibration_window", "request_rounds", "tokens_per_round", "round_us", "verify_us",
    "tokens_per_s", "mean_budget", "budgets", "prefix_clamped", "predicted_tokens_per_round",
    "calibration",
}
TABLE_KEYS = {"path", "gpu", "date", "commit", "heads", "page_size", "family", "tile"}
# `simulate --budget-compare --json`: the document, its config and one entry of its results.
COMPARE_KEYS = {"mode", "config", "cost_model", "results", "best_single_budget", "wall_seconds"}
COMPARE_CONFIG_KEYS = {"seed", "rounds", "depth", "top_k", "target", "accept_prob",
                       "draft_logit_range", "prompts", "budgets"}
COMPARE_RESULT_KEYS = {"prompt", "auto", "fixed", "best_listed", "best_any", "single"}
# The committed H200 table (tools/CMakeLists.txt installs it as the default).
H200_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "results",
                          "2026-12-02_h200_ffa2143_cost-table.json")

# The summary of a simulate run: one line per topic, in this order.
SUMMARY_LINES = [
    "summary", "  rounds ", "  requests ", "  tokens committed ", "  acceptance hist",
    "  verify attention ", "  commit ", "  defrag ", "  pool at end ", "  data checks ",
    "  trace ",
]


def run(*args, timeout=300):
    """Runs treemla with args; returns (exit code, stdout, stderr)."""
    p = subprocess.run([TREEMLA, *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def run_with_tty_stderr(*args, timeout=300):
    """Runs treemla with stderr on a pseudo-terminal; returns (exit code, stdout, stderr)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([TREEMLA, *args], stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    try:
        while True:  # read as it comes, so that the terminal's buffer never fills
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                err += chunk
            elif p.poll() is not None:
                break
        out = p.communicate(timeout=timeout)[0]
    finally:
        os.close(master)
    return p.returncode, out.decode(), err.decode()


def trace_of(stdout):
    m = re.search(r"^  trace +([0-9a-f]{16}) ", stdout, re.M)
    return m.group(1) if m else None


def cuda_info():
    """(CUDA kernels built, number of visible GPUs) as `treemla info` reports them."""
    rc, out, _ = run("info")
    assert rc == 0, "treemla info failed"
    built = "CUDA kernels: built for" in out
    m = re.search(r"visible GPUs: (\d+)", out)
    return built, int(m.group(1)) if m else 0


class DefaultJob(unittest.TestCase):
    def test_no_arguments_runs_simulate_with_its_summary(self):
        rc, out, err = run()
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        self.assertTrue(out.startswith("treemla simulate: seed 1, device cpu, 60 rounds\n"), out)
        lines = out.splitlines()
        self.assertIn("summary", lines)
        summary = lines[lines.index("summary"):]
        found = [p for p in SUMMARY_LINES if any(l.startswith(p) for l in summary)]
        self.assertEqual(found, SUMMARY_LINES, out)
        starts = [next(i for i, l in enumerate(summary) if l.startswith(p)) for p in SUMMARY_LINES]
        self.assertEqual(starts, sorted(starts), "summary lines out of order:\n" + out)
        self.assertRegex(out, r"(?m)^  rounds +60 in [0-9.]+ s wall$")
        self.assertRegex(out, r"(?m)^  data checks .* -> ok$")
        self.assertIsNotNone(trace_of(out), out)

    def test_same_as_simulate(self):
        rc1, out1, _ = run()
        rc2, out2, _ = run("simulate")
        self.assertEqual((rc1, rc2), (0, 0))
        self.assertEqual(trace_of(out1), trace_of(out2))
        self.assertEqual(out1.split("\n", 1)[0], out2.split("\n", 1)[0])

    def test_options_without_a_command_go_to_simulate(self):
        rc, out, err = run("--rounds", "5")
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("treemla simulate: seed 1, device cpu, 5 rounds\n"), out)
        rc2, out2, _ = run("simulate", "--rounds=5")
        self.assertEqual(rc2, 0)
        self.assertEqual(trace_of(out), trace_of(out2))
        rc, _, err = run("--rounds", "0")
        self.assertEqual(rc, 2)
        self.assertIn("treemla simulate: --rounds", err)

    def test_help(self):
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        for command in ("simulate", "bench", "bench-pool", "info"):
            self.assertRegex(out, r"(?m)^  %s " % re.escape(command))
        rc, out, _ = run("simulate", "--help")
        self.assertEqual(rc, 0)
        for option in ("--rounds", "--seed", "--heads", "--page-size", "--json"):
            self.assertIn(option, out)
        self.assertIn("60", out)  # the default of --rounds is shown


class OptionSyntax(unittest.TestCase):
    def json_run(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "out.json")
            rc, out, err = run("simulate", *args, "--json", path)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                return out, json.load(f)

    def test_equals_and_space_forms_agree(self):
        spaced = ["--rounds", "3", "--seed", "5", "--heads", "3", "--policy", "sorted",
                  "--accept-prob", "0.5", "--prompt-max", "64"]
        joined = ["--rounds=3", "--seed=5", "--heads=3", "--policy=sorted", "--accept-prob=0.5",
                  "--prompt-max=64"]
        mixed = ["--rounds=3", "--seed", "5", "--heads=3", "--policy", "sorted",
                 "--accept-prob=0.5", "--prompt-max", "64"]
        results = [self.json_run(*args) for args in (spaced, joined, mixed)]
        for out, doc in results:
            self.assertEqual(doc["config"]["rounds"], 3)
            self.assertEqual(doc["config"]["seed"], 5)
            self.assertEqual(doc["config"]["heads"], 3)
            self.assertEqual(doc["config"]["policy"], "sorted")
            self.assertEqual(doc["config"]["accept_prob"], 0.5)
            self.assertEqual(doc["config"]["prompt_max"], 64)
            self.assertEqual(trace_of(out), doc["trace"])
        self.assertEqual(results[0][1]["config"], results[1][1]["config"])
        self.assertEqual(results[0][1]["config"], results[2][1]["config"])
        self.assertEqual(results[0][1]["trace"], results[1][1]["trace"])
        self.assertEqual(results[0][1]["trace"], results[2][1]["trace"])

    def test_json_path_in_either_form(self):
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")
            self.assertEqual(run("simulate", *QUICK, "--json=" + a)[0], 0)
            self.assertEqual(run("simulate", *QUICK, "--json", b)[0], 0)
            with open(a) as fa, open(b) as fb:
                self.assertEqual(json.load(fa)["trace"], json.load(fb)["trace"])

    def test_later_option_wins_over_earlier(self):
        _, doc = self.json_run("--rounds", "7", "--rounds", "2")
        self.assertEqual(doc["config"]["rounds"], 2)


class BadOptions(unittest.TestCase):
    def assert_bad(self, args, *needles, rc=2):
        code, out, err = run(*args)
        self.assertEqual(code, rc, "treemla %s: exit %d, stderr %r" % (" ".join(args), code, err))
        self.assertNotIn("summary", out, "the run started: " + out)
        for needle in needles:
            self.assertIn(needle, err, "treemla %s" % " ".join(args))
        return err

    def test_unknown_option(self):
        self.assert_bad(["simulate", "--bogus", "1"], "--bogus")
        self.assert_bad(["simulate", "--round=3"], "--round")

    def test_unknown_command(self):
        self.assert_bad(["frobnicate"], "frobnicate")

    def test_unexpected_argument(self):
        self.assert_bad(["simulate", "extra"], "extra")

    def test_missing_value(self):
        self.assert_bad(["simulate", "--rounds"], "--rounds")

    def test_not_a_number(self):
        self.assert_bad(["simulate", "--heads", "abc"], "--heads", "abc")
        self.assert_bad(["simulate", "--rounds=2x"], "--rounds", "2x")
        self.assert_bad(["simulate", "--rounds="], "--rounds")
        self.assert_bad(["simulate", "--accept-prob", "high"], "--accept-prob")

    def test_out_of_range_names_the_bound(self):
        self.assert_bad(["simulate", "--heads", "129"], "--heads", "129", "[1, 128]")
        self.assert_bad(["simulate", "--heads=0"], "--heads", "[1, 128]")
        self.assert_bad(["simulate", "--rounds", "0"], "--rounds", "[1, 10000000]")
        self.assert_bad(["simulate", "--accept-prob", "1.5"], "--accept-prob", "[0, 1]")
        self.assert_bad(["simulate", "--topk", "300"], "--topk", "[1, 256]")
        self.assert_bad(["simulate", "--seed", "-1"], "--seed", "[0, 4294967295]")

    def test_rules_between_values(self):
        self.assert_bad(["simulate", "--page-size", "12"], "--page-size", "power of two")
        self.assert_bad(["simulate", "--prompt-min", "100", "--prompt-max", "50"], "--prompt-max",
                        "--prompt-min")
        self.assert_bad(["simulate", "--policy", "lifo"], "--policy", "as-freed", "sorted")
        self.assert_bad(["simulate", "--device", "tpu"], "--device", "cpu")
        self.assert_bad(["simulate", "--defrag-threshold", "0.5"], "--defrag-threshold")

    def test_budget_and_cost_model_options(self):
        self.assert_bad(["--budget", "2000"], "--budget", "'2000'", "auto or an integer in [1, 1024]")
        self.assert_bad(["--budget", "fast"], "--budget", "'fast'")
        self.assert_bad(["--layers", "61"], "--layers", "needs the cost model")
        self.assert_bad(["--calibration-window", "8", "--cost-table", H200_TABLE], "--calibration-window",
                        "--budget auto")
        self.assert_bad(["--budget", "auto", "--layers", "0"], "--layers", "[1, 1000]")
        self.assert_bad(["--budget", "auto", "--round-fixed-us", "-5"], "--round-fixed-us", "[0, 1e+09]")
        self.assert_bad(["--budget", "auto", "--round-per-node-us", "x"], "--round-per-node-us", "'x'")
        self.assert_bad(["--budget", "auto", "--budget-candidates", "all"], "--budget-candidates", "grid or every")
        self.assert_bad(["--budget", "auto", "--heads", "4"], "--heads", "'4'", "the cost table's heads, 8")
        self.assert_bad(["--budget", "auto", "--prompt-max", "262144", "--gen-max", "100"],
                        "--prompt-max 262144", "largest L, 262144")
        self.assert_bad(["--compare-prompts", "4096"], "--compare-prompts", "--budget-compare only")
        self.assert_bad(["--budget-compare", "--num-pages", "5"], "--num-pages", "does not apply to --budget-compare")
        self.assert_bad(["--budget-compare", "--compare-prompts", "300000"], "--compare-prompts", "'300000'",
                        "L range [1024, 262144]")
        self.assert_bad(["--budget-compare", "--compare-budgets", "1024"], "--compare-budgets", "'1024'",
                        "[0, 1023]")
        self.assert_bad(["--budget-compare", "--heads", "16"], "--heads", "'16'", "the cost table's heads, 8")
        self.assert_bad(["--budget-compare", "--page-size", "16"], "--page-size", "page size, 64")
        self.assert_bad(["--target", "oracle"], "--target", "children or drafter")
        self.assert_bad(["--draft-logit-range", "60"], "--draft-logit-range", "[0, 50]")

    def test_json_file_that_cannot_be_written(self):
        self.assert_bad(["simulate", "--json", "/nonexistent-dir/x.json"], "--json",
                        "/nonexistent-dir/x.json")

    def test_bad_options_of_the_other_commands(self):
        self.assert_bad(["info", "--bogus"], "--bogus")
        self.assert_bad(["bench-pool", "--fill", "2"], "--fill", "[0.1, 0.99]")
        self.assert_bad(["bench-pool", "--page-sizes", "1,3"], "--page-sizes", "'3'", "power of two")
        self.assert_bad(["bench", "--reps", "1"], "--reps", "[3, 1000]")

    def test_bench_values_are_checked_before_the_gpu(self):
        for args, needles in (
                (["--cases", "abc"], ["--cases", "'abc'", "batch:heads:q_len:prefix:page_size"]),
                (["--cases", "1:200:1:10:64"], ["--cases", "heads '200'", "[1, 128]"]),
                (["--cases", "1:8:1:10:12"], ["--cases", "page_size '12'", "power of two"]),
                (["--tiles", "foo"], ["--tiles", "'foo'", "all, smem99k or smem-large"]),
                (["--families", "wgmma"], ["--families", "'wgmma'", "cpasync, cluster, sm90a, decode or warpspec"]),
                (["--families", "sm90a,wgmma"], ["--families", "'wgmma'", "cpasync, cluster, sm90a, decode or warpspec"]),
                (["--cases", "abc", "--tiles", "foo"], ["--cases"])):
            err = self.assert_bad(["bench", *args], *needles)
            self.assertNotIn("no CUDA", err)

    def test_too_large_a_default_pool_names_the_options_given(self):
        err = self.assert_bad(["--prompt-min", "262144", "--prompt-max", "262144", "--max-requests", "256"],
                              "--max-requests 256", "--prompt-max 262144", "GiB")
        self.assertNotIn("--num-pages =", err)
        self.assertNotIn("--num-pages:", err)  # an option the user did not pass is not the culprit
        m = re.search(r"use --max-requests (\d+) or fewer", err)
        self.assertIsNotNone(m, err)
        self.assertEqual(m.group(1), "14")


class Summary(unittest.TestCase):
    def histogram(self, *args):
        rc, out, err = run(*args)
        self.assertEqual(rc, 0, err)
        line = next(l for l in out.splitlines() if l.startswith("  acceptance hist"))
        items = re.findall(r" (\d+)(?:-(\d+))?:(\d+)", line)
        self.assertTrue(items, line)
        self.assertTrue(all(int(count) > 0 for _, _, count in items), line)  # no empty bucket
        return line, items

    def test_acceptance_histogram_leaves_out_zeros(self):
        line, items = self.histogram(*QUICK, "--depth", "30", "--budget", "60")
        self.assertTrue(all(hi == "" for _, hi, _ in items), line)  # few lengths: one bucket each

    def test_acceptance_histogram_of_many_lengths_uses_ranges(self):
        # A chain drafter that the target nearly always follows: acceptance lengths up to ~100.
        line, items = self.histogram("--depth", "100", "--budget", "100", "--topk", "1", "--accept-prob",
                                     "0.97", "--rounds", "10", "--prompt-max", "64", "--max-requests", "8",
                                     "--gen-max", "2000")
        self.assertLessEqual(len(items), 16, line)
        self.assertTrue(any(hi for _, hi, _ in items), line)
        self.assertLess(len(line), 300, line)

    def test_defrag_off_reads_as_off(self):
        rc, out, _ = run("--defrag-threshold", "0", *QUICK)
        self.assertEqual(rc, 0)
        self.assertIn("defrag off (--defrag-threshold 0)", out)
        self.assertNotIn("never", out)
        rc, out, _ = run(*QUICK)
        self.assertIn("defrag when runs/request > 2 (full)", out)


class Progress(unittest.TestCase):
    # One round of about 2e10 flops: a few seconds on the CPU, long enough for the live line.
    LONG = ["--rounds", "1", "--heads", "16", "--budget", "256", "--depth", "16", "--topk", "16",
            "--prompt-min", "1000", "--prompt-max", "1000", "--max-requests", "2"]

    def test_live_line_on_a_terminal(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            rc, out, err = run_with_tty_stderr(*self.LONG, "--json", path)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                doc = json.load(f)  # the JSON holds no progress text
        self.assertEqual(set(doc), SIMULATE_KEYS)
        self.assertRegex(err, r"\r\[ *\d+%\] round 1/1 \d+% \(verify\) \| .* \| ETA \d+")
        self.assertTrue(err.endswith("\r\x1b[K"), repr(err[-40:]))  # erased before the summary
        self.assertNotIn("ETA", out)
        self.assertIn("summary", out)

    def test_no_live_line_without_a_terminal(self):
        rc, out, err = run(*self.LONG)
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        self.assertNotIn("ETA", out)


class JsonOutput(unittest.TestCase):
    def test_simulate_json_has_the_documented_keys(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "run.json")
            rc, out, err = run("simulate", *QUICK, "--json", path)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                doc = json.load(f)
        self.assertEqual(set(doc), SIMULATE_KEYS)
        for key, keys in SIMULATE_NESTED_KEYS.items():
            self.assertEqual(set(doc[key]), keys, key)
        self.assertEqual(doc["config"]["rounds"], 4)
        self.assertEqual(doc["config"]["device"], "cpu")
        self.assertEqual(doc["config"]["policy"], "as-freed")
        self.assertIs(doc["checks"]["passed"], True)
        self.assertEqual(doc["verify"]["calls"], 4)
        self.assertEqual(doc["trace"], trace_of(out))
        self.assertRegex(doc["trace"], r"^[0-9a-f]{16}$")
        self.assertIsNone(doc["gpu"])            # no GPU times on the CPU
        self.assertIsNone(doc["fragmentation"])  # the report is off on the CPU by default
        self.assertIsNone(doc["cost_model"])     # no cost table asked for
        self.assertEqual(doc["config"]["budget_mode"], "fixed")
        self.assertEqual(doc["config"]["target"], "children")
        self.assertGreaterEqual(doc["mean_acceptance"], 1.0)
        self.assertEqual(doc["request_rounds"] > 0, doc["tokens_committed"] > 0)
        for key in ("wall_seconds", "mean_acceptance"):
            self.assertIsInstance(doc[key], (int, float))
        for key in ("tree_nodes", "tokens_committed", "request_rounds"):
            self.assertIsInstance(doc[key], int)


class BudgetAuto(unittest.TestCase):
    """`simulate --budget auto`: the serving loop with the picker, on the committed table."""
    ARGS = ["--budget", "auto", "--rounds", "3", "--max-requests", "2", "--prompt-max", "64",
            "--gen-max", "32"]

    def test_runs_from_the_default_table_and_reports_the_cost_model(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "auto.json")
            rc, out, err = run(*self.ARGS, "--json", path)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                doc = json.load(f)
        self.assertIn("DDTree: budget auto (up to 1024 rows per request-round)", out)
        self.assertRegex(out, r"(?m)^  cost table: .*default-cost-table\.json \(NVIDIA H200, 2026-12-02")
        self.assertRegex(out, r"(?m)^  cost model +[0-9.]+ tokens/round, [0-9.]+ ms/round .* tokens/s")
        self.assertRegex(out, r"(?m)^  budgets +(\d+:\d+ )+\(B:request-rounds\)")
        self.assertEqual(set(doc), SIMULATE_KEYS)
        self.assertEqual(doc["config"]["budget_mode"], "auto")
        self.assertEqual(doc["config"]["budget"], 1023)   # trees are built at the table's largest budget
        self.assertEqual(doc["config"]["heads"], 8)       # --heads and --page-size come from the table
        self.assertEqual(doc["config"]["page_size"], 64)
        self.assertEqual(doc["config"]["target"], "drafter")
        cm = doc["cost_model"]
        self.assertEqual(set(cm), COST_MODEL_KEYS)
        self.assertEqual(set(cm["table"]), TABLE_KEYS)
        self.assertEqual((cm["table"]["gpu"], cm["table"]["heads"]), ("NVIDIA H200", 8))
        self.assertEqual((cm["layers"], cm["round_fixed_us"], cm["round_per_node_us"]), (78, 10000, 10))
        self.assertEqual(cm["request_rounds"], doc["request_rounds"])
        self.assertAlmostEqual(cm["tokens_per_round"], doc["mean_acceptance"])
        self.assertAlmostEqual(cm["tokens_per_s"], cm["tokens_per_round"] / cm["round_us"] * 1e6, places=6)
        self.assertEqual(sum(cm["budgets"].values()), doc["request_rounds"])
        for b in cm["budgets"]:
            self.assertIn(int(b), (0, 15, 31, 63, 127, 255, 511, 1023))
        self.assertEqual(cm["calibration"], 1.0)  # --calibration-window 0 by default

    def test_fixed_budget_with_a_cost_table_is_costed_and_unchanged(self):
        rc1, out1, err = run(*QUICK, "--heads", "8", "--page-size", "64")
        self.assertEqual(rc1, 0, err)
        rc2, out2, err = run(*QUICK, "--cost-table", H200_TABLE)
        self.assertEqual(rc2, 0, err)
        self.assertEqual(trace_of(out1), trace_of(out2))
        self.assertRegex(out2, r"(?m)^  budgets +15:\d+ \(B:request-rounds\)")


class BudgetCompare(unittest.TestCase):
    """`simulate --budget-compare`: auto beside fixed budgets, 4K to 185K, from the committed table."""

    def test_auto_within_two_percent_of_the_best_fixed_budget(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "compare.json")
            rc, out, err = run("simulate", "--budget-compare", "--json", path, timeout=120)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                doc = json.load(f)
        self.assertTrue(out.startswith("treemla simulate --budget-compare: seed 1, 400 rounds"), out)
        self.assertIn("gain of auto in tokens/s over", out)
        self.assertEqual(set(doc), COMPARE_KEYS)
        self.assertEqual(set(doc["config"]), COMPARE_CONFIG_KEYS)
        self.assertEqual(doc["config"]["prompts"], [4096, 8192, 16384, 32768, 65536, 131072, 185000])
        self.assertEqual(doc["config"]["budgets"], [15, 63, 255, 1023])
        self.assertEqual((doc["config"]["depth"], doc["config"]["top_k"]), (15, 8))
        for r in doc["results"]:
            self.assertEqual(set(r), COMPARE_RESULT_KEYS)
            fixed = {f["budget"]: f["tokens_per_s"] for f in r["fixed"]}
            self.assertTrue({15, 63, 255, 1023} <= set(fixed), fixed)
            best = max(fixed.values())
            # The stated margin (docs/budget.md): auto never more than 2% below the best fixed budget.
            self.assertGreaterEqual(r["auto"]["tokens_per_s"], 0.98 * best, r)
            self.assertAlmostEqual(r["best_any"]["gain"], r["auto"]["tokens_per_s"] / best - 1, places=9)
        # Long prompts make verify dear: auto's budget shrinks from 4K to 185K.
        budgets = [r["auto"]["mean_budget"] for r in doc["results"]]
        self.assertGreater(budgets[0], budgets[-1])

    def test_options_of_the_comparison(self):
        rc, out, err = run("simulate", "--budget-compare", "--compare-prompts", "2048,100000",
                           "--compare-budgets", "31", "--rounds", "20", "--layers", "61")
        self.assertEqual(rc, 0, err)
        self.assertIn("61 layers", out)
        self.assertRegex(out, r"(?m)^ +100000 +31 ")
        self.assertNotRegex(out, r"(?m)^ +2048 +63 ")


class CostTableFiles(unittest.TestCase):
    """The cost table reader (bad files) and where the default table is found."""

    def setUp(self):
        with open(H200_TABLE) as f:
            self.table = json.load(f)
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, doc, text=None):
        path = os.path.join(self.tmp.name, "table.json")
        with open(path, "w") as f:
            f.write(text if text is not None else json.dumps(doc))
        return path

    def assert_rejected(self, path, *needles):
        rc, out, err = run("--budget", "auto", "--cost-table", path)
        self.assertEqual(rc, 2, err)
        self.assertNotIn("summary", out)
        self.assertIn("--cost-table: '%s'" % path, err)
        for needle in needles:
            self.assertIn(needle, err)

    def changed(self, **changes):
        doc = json.loads(json.dumps(self.table))
        for key, value in changes.items():
            if value is None:
                del doc[key]
            else:
                doc[key] = value
        return doc

    def test_missing_keys_and_types(self):
        self.assert_rejected(self.write(self.changed(us=None)), 'key "us" is missing')
        self.assert_rejected(self.write(self.changed(heads="8")), '"heads" must be an integer, not "8"')
        self.assert_rejected(self.write(self.changed(n=16)), '"n" must be an array')
        self.assert_rejected(self.write(self.changed(gpu=None)), 'key "gpu" is missing')

    def test_wrong_shapes(self):
        us = self.table["us"]
        self.assert_rejected(self.write(self.changed(us=us[:7])), '"us" has 7 rows; must have len(n) = 8')
        short = [row[:] for row in us]
        short[2] = short[2][:8]
        self.assert_rejected(self.write(self.changed(us=short)), "us[2] has 8 entries; must have len(L) = 9")
        self.assert_rejected(self.write(self.changed(n=[1, 16, 16, 64, 128, 256, 512, 1024])),
                             "n[2] = 16 must be > n[1] = 16")

    def test_non_finite_and_non_positive_times(self):
        us = [row[:] for row in self.table["us"]]
        us[1][3] = None  # how JSON writers store NaN
        self.assert_rejected(self.write(self.changed(us=us)), "us[1][3] is null", "finite number > 0")
        us[1][3] = -2
        self.assert_rejected(self.write(self.changed(us=us)), "us[1][3] = -2 must be a finite number > 0")
        text = json.dumps(self.changed(us=self.table["us"])).replace(str(self.table["us"][0][0]), "1e999", 1)
        self.assert_rejected(self.write(None, text), "number overflow")

    def test_unreadable_files(self):
        self.assert_rejected(self.write(None, "{not json"), "not a valid JSON file")
        self.assert_rejected(self.write([1, 2]), "the top level must be a JSON object")
        missing = os.path.join(self.tmp.name, "missing.json")
        self.assert_rejected(missing, "cannot be opened")

    def test_default_table_lookup_order(self):
        # A binary with no table beside it says where it looked.
        bare = os.path.join(self.tmp.name, "bare")
        os.makedirs(bare)
        shutil.copy(TREEMLA, os.path.join(bare, "treemla"))
        p = subprocess.run([os.path.join(bare, "treemla"), "--budget", "auto"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("no default cost table found", p.stderr)
        self.assertIn(os.path.join(bare, "share", "treemla", "default-cost-table.json"), p.stderr)
        self.assertIn(os.path.join(self.tmp.name, "share", "treemla", "default-cost-table.json"), p.stderr)
        self.assertIn("--cost-table", p.stderr)
        # An installed tree (bin/treemla, share/treemla/...) and a build tree (share/ beside it).
        for binary, share in ((os.path.join(self.tmp.name, "bin"), os.path.join(self.tmp.name, "share")),
                              (bare, os.path.join(bare, "share"))):
            os.makedirs(os.path.join(share, "treemla"), exist_ok=True)
            table = os.path.join(share, "treemla", "default-cost-table.json")
            shutil.copy(H200_TABLE, table)
            os.makedirs(binary, exist_ok=True)
            shutil.copy(TREEMLA, os.path.join(binary, "treemla"))
            p = subprocess.run([os.path.join(binary, "treemla"), "--budget-compare", "--rounds", "5",
                                "--compare-prompts", "4096"], capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("cost table: %s (NVIDIA H200" % table, p.stdout)
            os.remove(table)


class PlotBudget(unittest.TestCase):
    """scripts/plot_budget.py draws its PNG from the tool's comparison; skipped without matplotlib."""

    def test_writes_a_png(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is not installed (pip install matplotlib)")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot_budget.py")
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "budget.png")
            p = subprocess.run([sys.executable, script, "--treemla", TREEMLA, "--out", png, "--rounds", "10",
                                "--prompts", "4096,65536,185000", "--profiles", "2,4"],
                               capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class Schedule(unittest.TestCase):
    """`treemla schedule` replays the schedule kernel's arithmetic (src/cuda/common/schedule_model.h)
    without a GPU. The expected work lists are the ones the docs state for the device schedule
    (docs/verify-kernel.md, "The work list" and "The refined last wave") and the session notes
    measured (bench/results/2026-12-02_h200_s17-notes.md)."""

    def schedule(self, *args):
        rc, out, err = run("schedule", *args)
        self.assertEqual(rc, 0, err)
        return out

    def chosen(self, out):
        lines = [l for l in out.splitlines() if l.startswith("  chosen: ")]
        self.assertEqual(len(lines), 1, out)
        return lines[0]

    def test_glm5_shape_leaves_six_ctas_idle(self):
        line = self.chosen(self.schedule("--cases", "1:8:65:185000:64"))
        self.assertIn("candidate 0 (1 wave, splits rounded down)", line)
        self.assertIn("14 splits a request; 126 work items on 132 CTAs", line)
        self.assertIn("(the last 126 of 132: 6 idle)", line)
        self.assertIn("126 partial slots, 9 combine groups", line)

    def test_row_tiles_past_the_grid_take_a_refined_last_wave(self):
        # 8 x 16 x 65 at 32K: 136 row tiles for 132 CTAs; 132 whole tiles, then 4 in 33 pieces.
        for family in ("sm90a", "warpspec"):
            line = self.chosen(self.schedule("--cases", "8:16:65:32768:64", "--family", family))
            self.assertIn("132 whole work items, then 4 items in 33 pieces each: 264 work items", line)

    def test_threshold_differs_by_family(self):
        # Estimated 3.5% faster refined: under warpspec's 97% threshold, not under sm90a's 96%.
        sm90a = self.chosen(self.schedule("--cases", "1:16:65:131072:64", "--family", "sm90a"))
        self.assertIn("candidate 2 (2 waves, splits rounded down)", sm90a)
        self.assertIn("255 work items on 132 CTAs, 2 waves", sm90a)
        warpspec = self.chosen(self.schedule("--cases", "1:16:65:131072:64", "--family", "warpspec"))
        self.assertIn("candidate 1 (1 wave, splits rounded up, refined last wave)", warpspec)

    def test_decode_runs_two_ctas_an_sm_and_fewer_waves(self):
        out = self.schedule("--cases", "8:16:1:131072:64", "--family", "decode")
        self.assertIn("264 CTAs = 132 SMs x 2; up to 4 waves, 1056 partial slots", out)
        self.assertIn("(more waves than the plan's 4)", out)
        self.assertIn("33 splits a request; 264 work items on 264 CTAs", self.chosen(out))

    def test_every_case_is_printed(self):
        out = self.schedule("--cases", "1:8:65:185000:64;2:8:65:131072:64", "--sms", "188")
        self.assertEqual(out.count("\ncase ") + out.startswith("case "), 2, out)
        self.assertIn("188 CTAs = 188 SMs x 1", out)

    def test_bad_options_name_the_bound(self):
        for args, msg in [(["--cases", "1:32:1:1000:64", "--family", "decode"],
                           "--cases: the decode family takes requests of at most 16 rows; case 1:32:1:1000 "
                           "has q_len * heads = 32"),
                          (["--cases", "default"], "'default' is bench's grid"),
                          (["--sms", "0"], "--sms"),
                          (["--family", "cluster"], "--family"),
                          (["--cases", "1:8:65"], "must be batch:heads:q_len:prefix:page_size")]:
            rc, out, err = run("schedule", *args)
            self.assertEqual(rc, 2, (args, out, err))
            self.assertIn(msg, err)


class WithoutGpu(unittest.TestCase):
    def setUp(self):
        self.cuda_built, gpus = cuda_info()
        if gpus > 0:
            self.skipTest("a GPU is visible: the benchmarks would run")

    def test_bench_says_it_needs_a_gpu(self):
        # a list of families is a good option: the run stops only for want of a GPU
        for args in (["bench"], ["bench-pool"], ["bench", "--families", "sm90a,warpspec"]):
            rc, out, err = run(*args)
            command = args[0]
            self.assertEqual(rc, 1, "%s: %r" % (command, err))
            self.assertEqual(out, "")
            self.assertRegex(err, r"^treemla %s: .*(no CUDA|needs a GPU)" % command)
            self.assertEqual(err.count("\n"), 1, err)  # one clear line, no trace

    def test_simulate_on_cuda(self):
        rc, out, err = run("simulate", "--device", "cuda", *QUICK)
        self.assertNotIn("summary", out)
        self.assertIn("--device", err)
        if self.cuda_built:
            self.assertEqual(rc, 1, err)  # no GPU is not a bad option
            self.assertIn("no CUDA device", err)
        else:
            self.assertEqual(rc, 2, err)
            self.assertIn("not available in this build", err)


def main():
    global TREEMLA
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "--treemla":
        TREEMLA, argv = argv[1], argv[2:]
    else:
        TREEMLA = os.environ.get("TREEMLA_BIN")
    if not TREEMLA or not os.access(TREEMLA, os.X_OK):
        sys.exit("test_cli.py: give the treemla binary with --treemla PATH (or $TREEMLA_BIN)")
    TREEMLA = os.path.abspath(TREEMLA)
    unittest.main(argv=[sys.argv[0], *argv], verbosity=2)


if __name__ == "__main__":
    main()
