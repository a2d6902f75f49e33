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
    "mean_acceptance", "verify", "defrags", "checks", "trace", "gpu", "fragmentation",
}
SIMULATE_NESTED_KEYS = {
    "config": {"device", "seed", "rounds", "heads", "budget", "depth", "top_k", "page_size",
               "num_pages", "max_requests", "prompt_min", "prompt_max", "gen_min", "gen_max",
               "policy", "defrag_threshold", "defrag_max_moves", "accept_prob", "check_every",
               "check_max_context"},
    "requests": {"admitted", "finished", "cut_short", "live_at_end", "admission_deferrals"},
    "verify": {"calls", "wall_seconds", "flops"},
    "defrags": {"runs", "skipped", "pages_relocated", "page_moves"},
    "checks": {"passed", "rows_checked", "row_mismatches", "nonfinite_outputs",
               "commit_plan_mismatches", "cross_checks", "cross_checks_skipped",
               "cross_check_failures", "cross_check_max_diff", "accept_mismatches",
               "layout_mismatches"},
}

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
        self.assertGreaterEqual(doc["mean_acceptance"], 1.0)
        self.assertEqual(doc["request_rounds"] > 0, doc["tokens_committed"] > 0)
        for key in ("wall_seconds", "mean_acceptance"):
            self.assertIsInstance(doc[key], (int, float))
        for key in ("tree_nodes", "tokens_committed", "request_rounds"):
            self.assertIsInstance(doc[key], int)


class WithoutGpu(unittest.TestCase):
    def setUp(self):
        self.cuda_built, gpus = cuda_info()
        if gpus > 0:
            self.skipTest("a GPU is visible: the benchmarks would run")

    def test_bench_says_it_needs_a_gpu(self):
        for command in ("bench", "bench-pool"):
            rc, out, err = run(command)
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
