"""dptrain used from outside, as docs/library.md shows it: installs this build into a temporary
prefix, builds each project of examples/ from its own folder against that prefix alone, runs it
on two ranks under torchrun and as two replicas in one process, and holds the accuracy each run
reached to a floor (printing them); then a tiny outside project that takes dptrain through
add_subdirectory configures and its source compiles against dptrain::dptrain.
Not here: the library's own equivalence tests (tests/parallel/), the driver's runs.
Usage: test_examples.py --build BUILD --source ROOT --python TORCHRUN_PYTHON
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

# What each example runs with (a few seconds each on two cores) and the accuracy it must reach:
# the floors sit some 5 points under what the runs reached on Debian's LibTorch 1.13 (mlp_adam
# 0.80, accumulate 0.81 with DataParallel's Nesterov SGD, both ways; the test prints each run's).
EXAMPLES = {
    "mlp_adam": (["--epochs", "2", "--train-limit", "6000", "--test-limit", "2000"], 0.75),
    "accumulate": (["--epochs", "2", "--accumulate", "4", "--train-limit", "6000",
                    "--test-limit", "2000"], 0.76),
}
# The settings of this build that a project built beside it must share: the same compiler and
# LibTorch, found the way this build found them.
PASSED_ON = ["CMAKE_CXX_COMPILER", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_BUILD_TYPE", "Torch_DIR",
             "CUDAToolkit_ROOT", "OPENSSL_ROOT_DIR", "OPENSSL_USE_STATIC_LIBS"]
# Two ranks on this machine. Underscored flags and explicit --redirects and --tee maps: Debian's
# torchrun 1.13 under Python 3.11 knows no other spelling and fails on its default maps (stderr
# is redirected and teed, so that each rank's stdout, with rank 0's accuracy, comes through).
TORCHRUN = ["--standalone", "--nproc_per_node=2", "--no_python", "--redirects=0:2,1:2",
            "--tee=0:2,1:2"]
ACCURACY = re.compile(r"^test acc: ([0-9.]+)$", re.M)


def run(command, what, cwd=None, timeout=600):
    """Runs `command`; on failure, one line naming `what` and the command's output."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"error: {what} failed (exit {done.returncode}): {' '.join(command)}\n"
                 f"{done.stdout}{done.stderr}")
    return done.stdout


def cache_settings(build):
    """-D flags for PASSED_ON, from BUILD's CMakeCache.txt."""
    flags = []
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            match = re.match(r"^([A-Za-z_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if match and match.group(1) in PASSED_ON and match.group(2) \
                    and not match.group(2).endswith("-NOTFOUND"):
                flags.append(f"-D{match.group(1)}={match.group(2)}")
    return flags


def build_example(name, source, prefix, scratch, settings):
    """Configures and builds examples/NAME against PREFIX alone; returns the executable."""
    build = os.path.join(scratch, name)
    run(["cmake", "-S", os.path.join(source, "examples", name), "-B", build, "-G", "Ninja",
         f"-DCMAKE_PREFIX_PATH={prefix}", *settings], f"configuring examples/{name}")
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        found = re.search(r"^dptrain_DIR:PATH=(.*)$", f.read(), re.M).group(1)
    if os.path.realpath(found) != os.path.realpath(os.path.join(prefix, "lib", "cmake", "dptrain")):
        sys.exit(f"error: examples/{name} found dptrain at {found}, not in the prefix {prefix}")
    run(["cmake", "--build", build, "-j", "1"], f"building examples/{name}")
    return os.path.join(build, name)


def accuracy(output, what):
    found = ACCURACY.findall(output)
    if len(found) != 1:
        sys.exit(f"error: {what} printed {len(found)} 'test acc:' lines, not one:\n{output}")
    return float(found[0])


def outside_project(source, scratch, settings):
    """A project of its own that takes dptrain by add_subdirectory: configured, and its source
    (examples/mlp_adam's) compiled against dptrain::dptrain. The library itself is not built
    again (minutes on two cores): its link interface is the one the installed examples link."""
    project = os.path.join(scratch, "outside")
    os.makedirs(project)
    shutil.copy(os.path.join(source, "examples", "mlp_adam", "mlp_adam.cpp"),
                os.path.join(project, "main.cpp"))
    with open(os.path.join(project, "CMakeLists.txt"), "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(f"""\
            cmake_minimum_required(VERSION 3.18)
            project(outside LANGUAGES CXX)
            add_subdirectory({source} dptrain)
            add_executable(outside main.cpp)
            target_link_libraries(outside PRIVATE dptrain::dptrain)
            """))
    build = os.path.join(project, "build")
    run(["cmake", "-S", project, "-B", build, "-G", "Ninja", *settings],
        "configuring an outside project with add_subdirectory(dptrain)")
    if os.path.exists(os.path.join(build, "dptrain", "app")):
        sys.exit("error: add_subdirectory(dptrain) configured the driver too; a project that "
                 "takes dptrain gets the library alone unless it sets DPTRAIN_BUILD_APP")
    run(["ninja", "-C", build, "CMakeFiles/outside.dir/main.cpp.o"],
        "compiling the outside project's source against dptrain::dptrain")
    print("add_subdirectory(dptrain): an outside project configured, and its main.cpp "
          "(examples/mlp_adam's) compiled against dptrain::dptrain")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--python", default="")
    args = parser.parse_args()
    if not args.python:
        sys.exit("error: no Python whose torch matches this LibTorch, for torchrun "
                 "(DPTRAIN_TORCHRUN_PYTHON in CMake): install python3-torch or name one")
    settings = cache_settings(args.build)
    with tempfile.TemporaryDirectory(prefix="dptrain-examples-") as scratch:
        prefix = os.path.join(scratch, "prefix")
        run(["cmake", "--install", args.build, "--prefix", prefix], "cmake --install")
        print(f"installed into {prefix}: "
              + ", ".join(sorted(os.listdir(os.path.join(prefix, "lib", "cmake", "dptrain")))))
        # Two at a time, one per core: the examples' builds, then the outside project's compile.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            built = {name: pool.submit(build_example, name, args.source, prefix, scratch, settings)
                     for name in EXAMPLES}
            outside = pool.submit(outside_project, args.source, scratch, settings)
            built = {name: future.result() for name, future in built.items()}
            outside.result()
        failures = []
        for name, (flags, floor) in EXAMPLES.items():
            runs = {
                "torchrun, 2 ranks": [args.python, "-m", "torch.distributed.run", *TORCHRUN,
                                      built[name], *flags],
                "one process, 2 replicas": [built[name], "--replicas", "2", *flags],
            }
            for how, command in runs.items():
                reached = accuracy(run(command, f"examples/{name} ({how})", timeout=300),
                                   f"examples/{name} ({how})")
                verdict = "ok" if reached >= floor else "BELOW THE FLOOR"
                print(f"examples/{name}, {how}: test acc {reached:.4f} (floor {floor:.2f}) {verdict}")
                if reached < floor:
                    failures.append(f"examples/{name} ({how}) reached {reached:.4f} < {floor}")
        if failures:
            sys.exit("error: " + "; ".join(failures))
    print("every example built against the installed prefix alone and reached its floor")


if __name__ == "__main__":
    main()
