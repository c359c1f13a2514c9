"""The driver is the library's first client: every #include "dptrain/..." in app/ names a header
that `cmake --install` installs, and nothing of app/ reaches into lib/src (a relative include, or
an include folder in app/CMakeLists.txt). The installed headers are closed too: each "dptrain/..."
that one of them includes is installed. Which headers are installed is read from the install
step itself: the build's dptrain_headers component, installed into a temporary prefix.
Not here: the order of the layers (layering_check.py), unused includes (include_check.py).
Usage: public_headers_check.py --build BUILD [ROOT]; --self-test --build BUILD plants each defect.
"""
import os
import re
import subprocess
import sys
import tempfile

import self_test as self_test_support

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE_SUFFIXES = (".h", ".cpp")


def installed_headers(build):
    """The headers' paths relative to the prefix's include/ ("dptrain/core/errors.h", ...), as
    the build's install step puts them."""
    with tempfile.TemporaryDirectory(prefix="dptrain-headers-") as prefix:
        done = subprocess.run(["cmake", "--install", build, "--component", "dptrain_headers",
                               "--prefix", prefix], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: cmake --install {build} --component dptrain_headers failed:\n"
                     f"{done.stdout}{done.stderr}")
        include = os.path.join(prefix, "include")
        return {os.path.relpath(os.path.join(directory, name), include)
                for directory, _, names in os.walk(include) for name in names}


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def check(root, installed):
    problems = []
    app = os.path.join(root, "app")
    for name in sorted(os.listdir(app)):
        if not name.endswith(SOURCE_SUFFIXES):
            continue
        for number, line in enumerate(read(os.path.join(app, name)).splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = match.group(1)
            where = f"app/{name}:{number}"
            if "lib/src" in target or target.startswith(".."):
                problems.append(f"{where}: includes \"{target}\", outside app/ and the installed "
                                f"headers; include the public header \"dptrain/...\" instead")
            elif target.startswith("dptrain/") and target not in installed:
                problems.append(f"{where}: includes \"{target}\", which `cmake --install` does "
                                f"not install (lib/install.cmake): make it public or leave it out")
    cmake_lists = re.sub(r"#.*", "", read(os.path.join(app, "CMakeLists.txt")))
    if re.search(r"lib/src|PROJECT_SOURCE_DIR\}/lib|\.\./lib", cmake_lists):
        problems.append("app/CMakeLists.txt: names a folder of lib/ (lib/src?): app/ sees the "
                        "library only through its targets and installed headers")
    for header in sorted(installed):
        path = os.path.join(root, "lib", "include", header)
        if not os.path.exists(path):
            continue
        for target in INCLUDE.findall(read(path)):
            if target.startswith("dptrain/") and target not in installed:
                problems.append(f"lib/include/{header}: the installed header includes "
                                f"\"{target}\", which is not installed")
    return problems


def self_test(here, build):
    def plant(path, line, extra_file=None):
        def edit(copy):
            if extra_file:
                os.makedirs(os.path.dirname(os.path.join(copy, extra_file)), exist_ok=True)
                with open(os.path.join(copy, extra_file), "w", encoding="utf-8") as f:
                    f.write("#pragma once\n")
            self_test_support.append_line(os.path.join(copy, path), line)
        return edit
    plants = [
        (plant("app/cli.cpp", '#include "dptrain/core/private_part.h"\n',
               "lib/src/core/dptrain/core/private_part.h"),
         ["app/cli.cpp", "dptrain/core/private_part.h", "does not install"]),
        (plant("app/main.cpp", '#include "../lib/src/parallel/reducer.cpp"\n'),
         ["app/main.cpp", "../lib/src/parallel/reducer.cpp", "outside app/"]),
        (plant("app/CMakeLists.txt",
               "target_include_directories(dptrain_cli PRIVATE ${PROJECT_SOURCE_DIR}/lib/src)\n"),
         ["app/CMakeLists.txt", "lib/src"]),
        (plant("lib/include/dptrain/parallel/world.h",
               '#include "dptrain/report/tensorboard_event.pb.h"\n'),
         ["parallel/world.h", "tensorboard_event.pb.h", "not installed"]),
    ]
    return self_test_support.run_self_test("public headers", os.path.abspath(__file__), here,
                                           ("lib", "app"), plants, extra_args=("--build", build))


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = argv[1:]
    run_self_test = "--self-test" in args
    args = [a for a in args if a != "--self-test"]
    if args[:1] != ["--build"] or len(args) < 2:
        sys.exit("usage: public_headers_check.py [--self-test] --build BUILD [ROOT]")
    build = os.path.abspath(args[1])
    if run_self_test:
        return self_test(here, build)
    root = os.path.abspath(args[2]) if len(args) > 2 else here
    installed = installed_headers(build)
    problems = check(root, installed)
    for problem in problems:
        print(problem)
    if problems:
        print(f"public headers: {len(problems)} problem(s)")
        return 1
    print(f"public headers: app/ includes only installed headers ({len(installed)} installed, "
          f"closed under their own includes) and nothing of lib/src")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
