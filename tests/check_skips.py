#!/usr/bin/env python3
"""Fails when a test skipped that was not expected to skip on this machine.

CTest counts a skipped GoogleTest test as passed, and a shard (tests/CMakeLists.txt, Note [One
test binary per layer]) passes whatever some of its tests skipped. So CI reads what every test
process wrote: GoogleTest's XML results (GTEST_OUTPUT, one file per shard or per test) and the
same shape from the Python suites (tests/integration/test_read_checkpoint.py), under the
build's Testing/gtest/, plus CTest's own JUnit file (ctest --output-junit) for the CTest entries
that skip by exit status (TwoHosts: 77). Each skip must match a line of the expected list
(tests/expected_skips.txt) whose condition holds here; any other skip fails the check, naming the
test and the reason it gave.

  check_skips.py --expected tests/expected_skips.txt --results build/Testing/gtest
                 [--ctest-junit build/Testing/ctest-junit.xml]
  check_skips.py --self-test tests/expected_skips.txt

The expected list: one line per pattern, `<pattern> | <condition> | <reason>`. The pattern is a
shell pattern on the test's name (Suite.Name, with the parameter after a '/'); the condition says
on which machines it skips (see CONDITIONS), and the reason is what a reader needs to know.
"""
import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_gpu():
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pypi_libtorch(build_dir):
    """Whether the build under test links a LibTorch from PyPI (2.x) rather than Debian's 1.13,
    read from its CMake cache (Torch_DIR); False where there is no cache to read."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8",
                  errors="replace") as cache:
            for line in cache:
                if line.startswith("Torch_DIR:"):
                    return not line.split("=", 1)[1].strip().startswith("/usr/")
    except OSError:
        pass
    return False


def machine_facts(build_dir=None):
    flags = cpu_flags()
    gpu = has_gpu()
    return {
        "always": True,
        "no-gpu": not gpu,
        "gpu": gpu,
        "no-avx2": "avx2" not in flags,
        "no-avx512": "avx512f" not in flags,
        "avx512": "avx512f" in flags,
        "root": os.geteuid() == 0,
        "not-root": os.geteuid() != 0,
        "sanitizer": os.environ.get("DPTRAIN_SANITIZED_RUN") == "1",
        "pypi-libtorch": bool(build_dir) and pypi_libtorch(build_dir),
    }


CONDITIONS = ("always", "no-gpu", "gpu", "no-avx2", "no-avx512", "avx512", "root", "not-root",
              "sanitizer", "pypi-libtorch")


def read_expected(path):
    """[(pattern, [conditions], reason, line number)]; a malformed line is an error."""
    expected = []
    with open(path, encoding="utf-8") as listing:
        for number, line in enumerate(listing, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [part.strip() for part in line.split("|")]
            if len(parts) != 3 or not all(parts):
                raise SystemExit(f"error: {path}:{number}: want '<pattern> | <condition> | "
                                 f"<reason>', got: {line}")
            conditions = parts[1].split("+")
            for condition in conditions:
                if condition not in CONDITIONS:
                    raise SystemExit(f"error: {path}:{number}: unknown condition '{condition}' "
                                     f"(known: {', '.join(CONDITIONS)})")
            expected.append((parts[0], conditions, parts[2], number))
    return expected


def skipped_in_xml(path, ctest=False):
    """{test name: reason} of the test cases an XML results file marks as skipped. GoogleTest
    names a case by its suite (classname) and name; CTest's JUnit file by the CTest name alone."""
    try:
        root = ElementTree.parse(path).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise SystemExit(f"error: {path}: unreadable test results ({error})")
    skipped = {}
    for case in root.iter("testcase"):
        marker = case.find("skipped")
        if marker is None and case.get("result") != "skipped" and case.get("status") != "notrun":
            continue
        suite = "" if ctest else case.get("classname", "")
        name = case.get("name", "")
        full = f"{suite}.{name}" if suite else name
        reason = (marker.get("message") if marker is not None else None) or ""
        if marker is not None and not reason:
            reason = (marker.text or "").strip()
        # GoogleTest's message starts with the file and line of the skip.
        reason = re.sub(r"^\S+:\d+\s+", "", " ".join(reason.split()))
        skipped[full] = reason[:200]
    return skipped


def collect_skips(results_dir, ctest_junit):
    skipped = {}
    if results_dir:
        if not os.path.isdir(results_dir):
            raise SystemExit(f"error: {results_dir}: no test results (did the tests run?)")
        # A parameterised integration test's file lies in a folder named by the '/' in its name.
        files = sorted(os.path.join(folder, f) for folder, _, names in os.walk(results_dir)
                       for f in names if f.endswith(".xml"))
        if not files:
            raise SystemExit(f"error: {results_dir}: no test results (did the tests run?)")
        for path in files:
            skipped.update(skipped_in_xml(path))
    if ctest_junit:
        for name, reason in skipped_in_xml(ctest_junit, ctest=True).items():
            # CTest's names carry the integration binary's prefix and, for a parameterised test,
            # GoogleTest's "  # GetParam() = ..." after the name; the gtest name is the key.
            bare = name.split("  # ", 1)[0]
            bare = bare.split(".", 1)[1] if bare.startswith("integration.") else bare
            if bare not in skipped:
                skipped[bare] = reason or "skipped (CTest)"
    return skipped


def check(skipped, expected, facts):
    """The lines to print for the unexpected skips (empty: all expected)."""
    problems = []
    for name in sorted(skipped):
        matches = [e for e in expected if fnmatch.fnmatchcase(name, e[0])]
        if not matches:
            problems.append(f"unexpected skip: {name}: {skipped[name]} (not in the expected list)")
        elif not any(all(facts[c] for c in conditions) for _, conditions, _, _ in matches):
            where = ", ".join(f"line {n}: {'+'.join(c)}" for _, c, _, n in matches)
            problems.append(f"unexpected skip: {name}: {skipped[name]} (expected only where "
                            f"{where}, which does not hold here)")
    return problems


def run(args):
    expected = read_expected(args.expected)
    skipped = collect_skips(args.results, args.ctest_junit)
    # The build directory: the one given, or the one the results lie in (<build>/Testing/gtest).
    build_dir = args.build_dir or (os.path.dirname(os.path.dirname(os.path.abspath(args.results)))
                                   if args.results else None)
    facts = machine_facts(build_dir)
    problems = check(skipped, expected, facts)
    held = ", ".join(k for k in CONDITIONS if facts[k])
    for line in problems:
        print(f"check_skips: {line}", file=sys.stderr)
    if problems:
        print(f"error: {len(problems)} of {len(skipped)} skipped tests were not expected to skip "
              f"on this machine ({held}); a skip is not a pass (tests/expected_skips.txt)",
              file=sys.stderr)
        return 1
    print(f"check_skips: {len(skipped)} tests skipped, each as tests/expected_skips.txt expects "
          f"here ({held})")
    for name in sorted(skipped):
        print(f"  skipped: {name}: {skipped[name]}")
    return 0


def self_test(expected_path):
    """An expected skip passes, a planted unexpected one fails, and so does one whose condition
    does not hold; results written the way GoogleTest writes them."""
    expected = read_expected(expected_path)
    if not expected:
        print(f"check_skips self-test: {expected_path} lists nothing", file=sys.stderr)
        return 1
    first = expected[0]
    with tempfile.TemporaryDirectory() as work:
        def results(cases):
            body = "".join(
                f'<testcase name="{n}" status="run" result="skipped" classname="{s}">'
                f'<skipped message="{m}"/></testcase>' for s, n, m in cases)
            with open(os.path.join(work, "shard.xml"), "w", encoding="utf-8") as out:
                out.write(f'<testsuites><testsuite name="x">{body}</testsuite></testsuites>')
        facts = machine_facts()
        everywhere = {condition: True for condition in CONDITIONS}
        failures = []
        # The list's first pattern, made a name, on a machine where its condition holds.
        suite, _, name = first[0].replace("*", "X").partition(".")
        results([(suite, name, "expected")])
        if check(collect_skips(work, None), expected, everywhere):
            failures.append(f"an expected skip ({first[0]}) was reported as unexpected")
        results([("PlantedSuite", "PlantedUnexpectedSkip", "planted by the self-test")])
        if not check(collect_skips(work, None), expected, facts):
            failures.append("a planted unexpected skip passed the check")
        planted = [("Planted.OnlyOnGpuMachines", ["always"], "x", 1)]
        gpuless = [("Planted.OnlyOnGpuMachines", ["root", "not-root"], "x", 1)]
        results([("Planted", "OnlyOnGpuMachines", "planted")])
        if check(collect_skips(work, None), planted, facts):
            failures.append("a skip matching an 'always' line was reported")
        if not check(collect_skips(work, None), gpuless, facts):
            failures.append("a skip whose condition cannot hold passed the check")
    for failure in failures:
        print(f"check_skips self-test: {failure}", file=sys.stderr)
    if not failures:
        print("check_skips self-test: an expected skip passes; a planted unexpected skip and a "
              "skip whose condition does not hold both fail")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expected")
    parser.add_argument("--results", help="directory of GoogleTest-style XML results")
    parser.add_argument("--ctest-junit", help="CTest's --output-junit file")
    parser.add_argument("--build-dir", help="the build under test (default: from --results)")
    parser.add_argument("--self-test", metavar="EXPECTED")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.self_test)
    if not args.expected or not (args.results or args.ctest_junit):
        parser.error("--expected and --results (or --ctest-junit) are needed")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
