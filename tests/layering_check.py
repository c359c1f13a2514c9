#!/usr/bin/env python3
"""Keeps the layers real. Every `#include "dptrain/<layer>/..."` in lib/, app/, tests/, fuzz/ and
bench/ must point at the file's own layer or one below it, in the order of LAYERS; inside lib/ it
must point at the file's own layer or one that its layer's library links in lib/CMakeLists.txt,
and each layer must link only the layers its files include (the links are a graph: parallel links
core alone). Inside a layer's lib/ files no component (a header with its source) may reach itself
through includes. Every header of lib/include/dptrain/<layer>/ must have
tests/<layer>/test_<name>.cpp or a line in tests/CMakeLists.txt naming what covers it; no source
may sit outside a layer folder; and inside lib/ no file of a layer includes that layer's top
header (TOP_HEADERS) but the header's own source.

    python3 tests/layering_check.py [ROOT]       # the check; exit 1 naming each bad edge
    python3 tests/layering_check.py --self-test  # plants each defect in a copy, which must fail

When it fails, move the code to where it belongs; do not add an exception here.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import self_test as self_test_support  # noqa: E402

# Bottom to top. A file may include its own layer and the layers before it; a file of lib/ only
# those its layer links. Tests of a layer link their layer's test helpers (tests/CMakeLists.txt),
# which bring the data layer, so they keep to this order alone.
LAYERS = ["core", "data", "parallel", "model", "train", "report", "app"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"dptrain/([a-z_]+)/([^"]+)"', re.M)
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)"', re.M)
# add_dptrain_layer(dptrain_X LINKS ...) and target_link_libraries(dptrain_X ...) in lib/.
LINK = re.compile(r"\b(?:add_dptrain_layer|target_link_libraries)\s*\(\s*dptrain_([a-z]+)\b"
                  r"([^)]*)\)")
SOURCE_SUFFIXES = (".h", ".cpp", ".cu")
# The header a layer offers the layers above as its entry point. Inside the layer only its own
# source includes it: what the layer's other files share (options, callbacks, figures, the model's
# parts) has a header of its own lower down, so that the layer's files do not point up at its top.
TOP_HEADERS = {"model": "model.h", "train": "train.h", "report": "report.h"}
# Include circles inside a layer that a change in progress is removing, each as (layer, its
# components): the check fails on any other circle, and on a listed one that is gone. None now.
KNOWN_CIRCLES = []


def layer_of(root, path):
    """The layer a file belongs to, or None for files that sit above every layer (tests of the
    app, the integration tests, fuzzers, benchmarks may include any layer)."""
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[:3] == ["lib", "include", "dptrain"] and len(rel) == 5:
        return rel[3]
    if rel[:2] == ["lib", "src"] and len(rel) == 4:
        return rel[2]
    if rel[0] == "app":
        return "app"
    if rel[0] == "tests" and len(rel) == 3 and rel[1] in LAYERS:
        return rel[1]  # a layer's tests include that layer and those below
    return None


def sources(root, top):
    for directory, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(directory, name)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def library_links(root):
    """{layer: the layers its library links}, from lib/CMakeLists.txt (comments left out)."""
    text = re.sub(r"#.*", "", read(os.path.join(root, "lib", "CMakeLists.txt")))
    links = {layer: set() for layer in LAYERS[:-1]}
    for match in LINK.finditer(text):
        if match.group(1) in links:
            links[match.group(1)].update(
                name for name in re.findall(r"\bdptrain_([a-z]+)\b", match.group(2))
                if name in links and name != match.group(1))
    return links


def check_links(root, links, included):
    """Each layer links only layers below it, and exactly those its lib/ files include."""
    problems = []
    for layer, below in sorted(links.items(), key=lambda item: LAYERS.index(item[0])):
        for other in sorted(below, key=LAYERS.index):
            if LAYERS.index(other) > LAYERS.index(layer):
                problems.append(f"lib/CMakeLists.txt: dptrain_{layer} links dptrain_{other}, "
                                f"a layer above it (order: {' <- '.join(LAYERS)})")
            elif other not in included[layer]:
                problems.append(f"lib/CMakeLists.txt: dptrain_{layer} links dptrain_{other}, "
                                f"which none of its files includes; link only what it includes")
    return problems


def check_include(root, path, mine, links, target, name, line):
    """The problems of one `#include "dptrain/<target>/<name>"` at `line` of `path`."""
    where = f"{os.path.relpath(path, root)}:{line}"
    if target not in LAYERS:
        return [f'{where}: includes "dptrain/{target}/{name}", which is in no layer']
    problems = []
    if not os.path.exists(os.path.join(root, "lib", "include", "dptrain", target, name)):
        problems.append(f'{where}: includes "dptrain/{target}/{name}", which does not exist')
    if mine is None:
        return problems
    rel = os.path.relpath(path, root).split(os.sep)
    if LAYERS.index(target) > LAYERS.index(mine):
        problems.append(f'{where}: the {mine} layer includes "dptrain/{target}/{name}", a layer '
                        f'above it (order: {" <- ".join(LAYERS)})')
    elif rel[0] == "lib" and target != mine and target not in links[mine]:
        linked = ", ".join(sorted(links[mine], key=LAYERS.index)) or "no layer"
        problems.append(f'{where}: the {mine} layer includes "dptrain/{target}/{name}", a layer '
                        f"it does not link (lib/CMakeLists.txt: dptrain_{mine} links {linked})")
    own_source = os.path.splitext(rel[-1])[0] == os.path.splitext(name)[0]
    if (rel[0] == "lib" and target == mine and TOP_HEADERS.get(mine) == name
            and not own_source):
        problems.append(f'{where}: includes "dptrain/{target}/{name}", its layer\'s top header; '
                        f"include the header of what it uses instead")
    return problems


def component_graph(root, layer):
    """{component: components it includes} over a layer's files of lib/, a component being a
    header and the source of the same name (lib/include/dptrain/<layer>/ and lib/src/<layer>/)."""
    graph = {}
    for top in (f"lib/include/dptrain/{layer}", f"lib/src/{layer}"):
        for path in sources(root, top):
            text = read(path)
            edges = graph.setdefault(os.path.splitext(os.path.basename(path))[0], set())
            targets = [name for target, name in INCLUDE.findall(text) if target == layer]
            targets += LOCAL_INCLUDE.findall(text)
            edges.update(os.path.splitext(name)[0] for name in targets)
    for component, edges in graph.items():
        edges.discard(component)
        edges.intersection_update(graph)
    return graph


def circles(graph):
    """The strongly connected components of more than one node (Tarjan), each a set."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.add(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def check_circles(root):
    """No include circle among the components of a layer, but the KNOWN_CIRCLES, each present."""
    problems = []
    for layer in LAYERS[:-1]:
        found = circles(component_graph(root, layer))
        for circle in found:
            if (layer, circle) not in KNOWN_CIRCLES:
                names = ", ".join(f"{layer}/{c}" for c in sorted(circle))
                problems.append(f"lib/src/{layer}: include circle between {names}; move what "
                                f"they share into a header of its own that includes none of them")
        for known_layer, circle in KNOWN_CIRCLES:
            if known_layer == layer and circle not in found:
                problems.append(f"tests/layering_check.py: the known circle "
                                f"{sorted(circle)} of {layer} is gone; delete it from "
                                f"KNOWN_CIRCLES")
    return problems


def check(root):
    problems = []
    # Sources outside a layer folder.
    for top in ("lib/include/dptrain", "lib/src"):
        for path in sources(root, top):
            if layer_of(root, path) not in LAYERS:
                problems.append(f"{os.path.relpath(path, root)}: not inside a layer folder "
                                f"({', '.join(LAYERS[:-1])})")
    # Include edges, and which layers each layer's lib/ files include.
    links = library_links(root)
    included = {layer: set() for layer in links}
    for top in ("lib", "app", "tests", "fuzz", "bench"):
        for path in sources(root, top):
            mine = layer_of(root, path)
            text = read(path)
            for match in INCLUDE.finditer(text):
                target, name = match.group(1), match.group(2)
                line = text.count("\n", 0, match.start()) + 1
                problems += check_include(root, path, mine, links, target, name, line)
                if top == "lib" and mine in included and target != mine:
                    included[mine].add(target)
    problems += check_links(root, links, included)
    problems += check_circles(root)
    # A test file per header, or a line in tests/CMakeLists.txt naming what covers it.
    test_list = read(os.path.join(root, "tests", "CMakeLists.txt"))
    for path in sources(root, "lib/include/dptrain"):
        layer = layer_of(root, path)
        name = os.path.splitext(os.path.basename(path))[0]
        own = os.path.join(root, "tests", layer, f"test_{name}.cpp")
        named = re.search(rf"^#\s+{layer}/{name}\.h\s+\S", test_list, re.M)
        if not os.path.exists(own) and not named:
            problems.append(f"lib/include/dptrain/{layer}/{name}.h: no tests/{layer}/test_{name}"
                            f".cpp and no line '#   {layer}/{name}.h  covered by ...' in "
                            f"tests/CMakeLists.txt")
    return problems


def self_test(root):
    """Copies of the tree with one defect planted must fail, naming it: an upward include, an
    include of a layer's top header from inside the layer, an include of a layer the includer's
    layer does not link, a link that no include needs, and an include circle inside a layer."""
    def plant(*edits):
        return lambda copy: [self_test_support.append_line(os.path.join(copy, path), line)
                             for path, line in edits]
    plants = [
        (plant(("lib/src/core/files.cpp", '#include "dptrain/train/train.h"\n')),
         ["lib/src/core/files.cpp", "a layer above it"]),
        (plant(("lib/src/train/finite.cpp", '#include "dptrain/train/train.h"\n')),
         ["lib/src/train/finite.cpp", "top header"]),
        (plant(("lib/src/parallel/reducer.cpp", '#include "dptrain/data/batching.h"\n')),
         ["lib/src/parallel/reducer.cpp", "does not link"]),
        (plant(("lib/CMakeLists.txt", "target_link_libraries(dptrain_parallel PUBLIC dptrain_data)\n")),
         ["dptrain_parallel links dptrain_data"]),
        (plant(("lib/src/core/random.cpp", '#include "dptrain/core/sha256.h"\n'),
               ("lib/src/core/sha256.cpp", '#include "dptrain/core/random.h"\n')),
         ["include circle", "core/random", "core/sha256"]),
    ]
    return self_test_support.run_self_test("layering", os.path.abspath(__file__), root,
                                           ("lib", "app", "tests", "fuzz", "bench"), plants)


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[1:2] == ["--self-test"]:
        return self_test(here)
    root = os.path.abspath(argv[1]) if len(argv) > 1 else here
    problems = check(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"layering: {len(problems)} problem(s); move the code to where it belongs")
        return 1
    print(f"layering: every include points down ({' <- '.join(LAYERS)}) to a layer its layer "
          f"links, every link is included, and no layer has an include circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
