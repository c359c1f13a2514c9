#!/usr/bin/env python3
"""scripts/compare_models.py on pairs of files whose difference is known exactly, NaN and
infinities included: the figure it prints, the tensor it names, its exit status (0 equal, 1 they
differ, 2 they could not be compared) and a stderr that is empty unless it could not. The script
backs every bit-identity claim of the tests and benchmarks (scripts/two-hosts.sh), so a NaN that
hides, or an inf that differs from itself, would make those claims worthless.

    .venv-tests/bin/python3 tests/integration/test_compare_models.py [-v]   # scripts/test-venv.sh

The files are written by tests/support/dptrain_safetensors.py, not by dptrain.
"""
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import dptrain_safetensors as st  # noqa: E402

SCRIPT = os.environ.get("COMPARE_MODELS_SCRIPT") or os.path.join(HERE, "..", "..", "scripts",
                                                                  "compare_models.py")
NAN, INF = float("nan"), float("inf")


def model(path, **tensors):
    """A checkpoint holding float32 tensors (name → list of floats), in the order given."""
    rows = [(name.replace("_", "."), "F32", [len(v)], struct.pack(f"<{len(v)}f", *v))
            for name, v in tensors.items()]
    with open(path, "wb") as f:
        f.write(st.checkpoint(st.valid_state(), rows))
    return path


def compare(first, second, *flags, script=None):
    command = [sys.executable, *(script or [SCRIPT]), first, second, *flags]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout.strip(), run.stderr.strip()


# compare_models.py with its comparison made to raise, as a fault of the script would.
FAULTY = """
import sys, types
sys.argv = sys.argv[1:]
module = types.ModuleType("compare_models")
module.__file__ = sys.argv[0]
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), module.__dict__)
def largest_difference(a, b):
    raise RuntimeError("planted fault\\nsecond line")
module.largest_difference = largest_difference
sys.exit(module.main())
"""


class CompareModels(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = lambda name: os.path.join(self.dir.name, name)

    def tearDown(self):
        self.dir.cleanup()

    def test_a_nan_tensor_after_a_finite_difference_is_the_largest(self):
        a = model(self.path("a"), a_weight=[1.0, 2.0], b_weight=[0.0])
        b = model(self.path("b"), a_weight=[1.0, 2.5], b_weight=[NAN])
        status, out, err = compare(a, b, "--tolerance", "1")
        self.assertEqual(status, 1)
        self.assertIn("max |difference| inf in b.weight over 2 parameters", out)
        self.assertIn("note: the second model holds 1 non-finite value(s)", out)
        self.assertEqual(err, "")

    def test_an_all_nan_model_is_not_identical_at_tolerance_zero(self):
        a = model(self.path("a"), a_weight=[0.5], b_weight=[NAN, NAN, NAN])
        b = model(self.path("b"), a_weight=[0.5], b_weight=[0.0, 1.0, -1.0])
        self.assertEqual(compare(a, b), (1, "max |difference| inf in b.weight over 2 parameters\n"
                                            "note: the first model holds 3 non-finite value(s)", ""))
        self.assertEqual(compare(b, a), (1, "max |difference| inf in b.weight over 2 parameters\n"
                                            "note: the second model holds 3 non-finite value(s)", ""))

    def test_identical_files_holding_inf_and_nan_are_identical_and_say_so(self):
        a = model(self.path("a"), a_weight=[INF, -INF, NAN, 0.5])
        b = model(self.path("b"), a_weight=[INF, -INF, NAN, 0.5])
        status, out, err = compare(a, b)
        self.assertEqual(status, 0, out)
        self.assertIn("max |difference| 0 in a.weight", out)
        self.assertEqual(err, "")
        self.assertIn("note: the first model holds 3 non-finite value(s)", out)

    def test_opposite_infinities_differ_infinitely(self):
        a = model(self.path("a"), a_weight=[INF])
        b = model(self.path("b"), a_weight=[-INF])
        status, out, err = compare(a, b, "--tolerance", "1e300")
        self.assertEqual((status, out.splitlines()[0], err),
                         (1, "max |difference| inf in a.weight over 1 parameters", ""))

    def test_finite_differences_name_the_first_largest(self):
        a = model(self.path("a"), a_weight=[1.0, 2.0], b_weight=[3.0], c_weight=[0.0])
        b = model(self.path("b"), a_weight=[1.0, 2.25], b_weight=[3.25], c_weight=[0.125])
        status, out, err = compare(a, b, "--tolerance", "0.25")
        self.assertEqual((status, out), (0, "max |difference| 0.25 in a.weight over 3 parameters"))
        self.assertEqual(err, "")
        self.assertEqual(compare(a, b, "--tolerance", "0.2"),
                         (1, "max |difference| 0.25 in a.weight over 3 parameters", ""))

    def test_a_tolerance_that_is_not_a_finite_number_at_least_zero_is_refused(self):
        a = model(self.path("a"), a_weight=[1.0])
        for bad in ("nan", "inf", "-1", "x"):
            status, _, err = compare(a, a, "--tolerance", bad)
            self.assertEqual(status, 2, bad)  # argparse's usage error
            self.assertIn("--tolerance", err, bad)

    def test_models_that_cannot_be_compared_are_one_error_line_and_exit_2(self):
        a = model(self.path("a"), a_weight=[1.0, 2.0])
        other_names = model(self.path("b"), b_weight=[1.0, 2.0])
        other_shape = model(self.path("c"), a_weight=[1.0])
        for second, words in ((other_names, "error: the models have different parameters"),
                              (other_shape, "error: the models' a.weight differ in shape: [2] "
                                            "and [1]"),
                              (self.path("absent"), "error: ")):
            status, out, err = compare(a, second)
            self.assertEqual((status, out, len(err.splitlines())), (2, "", 1), err)
            self.assertTrue(err.startswith(words), err)

    def test_a_fault_of_the_script_is_one_error_line_and_exit_2_not_they_differ(self):
        a = model(self.path("a"), a_weight=[NAN, NAN])
        b = model(self.path("b"), a_weight=[0.0, 1.0])
        status, out, err = compare(a, b, script=["-c", FAULTY, SCRIPT])
        self.assertEqual((status, out), (2, ""), err)
        self.assertEqual(err, f"error: compare_models.py could not compare {a} and {b}: "
                              "RuntimeError: planted fault second line")


if __name__ == "__main__":
    unittest.main()
