"""The package's layers (docs/layout.md): each folder imports only its own layer and those below, with no cycle.

Every ``import`` in every module counts, also the ones inside functions (a cycle hidden in a function
is still a cycle: it only waits for the first call to show). The oracle is the source itself, read
with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minddp"

#: Bottom to top. A module belongs to the longest prefix listed; it may import its own layer and lower ones.
LAYERS = [
    ("runtime", ["minddp.runtime"]),
    ("debug", ["minddp.debug"]),
    ("comm", ["minddp.comm", "minddp.collectives"]),
    ("rungs", ["minddp.stages", "minddp.ddp", "minddp.sharding", "minddp.diloco"]),
    ("ladder", ["minddp.ladder"]),
    ("fault tolerance", ["minddp.ft"]),
    ("analysis", ["minddp.analysis", "minddp.costmodel"]),
    ("train", ["minddp.train"]),
    (
        "tools",
        [
            "minddp.bench",
            "minddp.notebook",
            "minddp.exercises",
            "minddp.doctor",
            "minddp.analyze",
            "minddp.model",
            "minddp.costmodel.__main__",
            "minddp.costmodel.project",
            "minddp.costmodel.validate",
            "minddp.ft.bench",
        ],
    ),
    ("public API", ["minddp"]),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    best = max(
        (
            (len(prefix), i)
            for i, (_, prefixes) in enumerate(LAYERS)
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer: add its folder to LAYERS and to docs/layout.md"
    return best[1]


def imports_of(module: str) -> dict[str, int]:
    """The minddp modules ``module`` imports (anywhere in it), each with the line of its first import."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # ``from a import b``: the module a.b where there is one, else a itself.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # import minddp.x.y.z where z is a name: minddp.x.y
                target = target.rpartition(".")[0]
            if target.startswith("minddp") and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def crossings(graph: dict[str, dict[str, int]]) -> list[str]:
    return sorted(
        f"{m}:{line} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items()
        for t, line in targets.items()
        if layer_of(t) > layer_of(m)
    )


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module: each is a cycle."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_imports_only_its_own_layer_and_lower_ones():
    assert not crossings(GRAPH), "layers crossed:\n" + "\n".join(crossings(GRAPH))


def test_no_module_imports_the_public_api_from_inside_the_package():
    # The package's own modules name the module they need (minddp.runtime.launch), never the root:
    # importing the root from inside would tie every layer to the top one.
    inward = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line}"
        for m, targets in GRAPH.items()
        for t, line in targets.items()
        if t == "minddp" and m not in ("minddp.analyze", "minddp.model")
    ]
    assert not inward, "imports of the root package from inside it: " + ", ".join(inward)


def test_the_module_graph_has_no_cycle():
    assert not cycles(GRAPH), "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles(GRAPH))


def test_the_checks_catch_a_crossing_a_cycle_and_imports_inside_functions():
    # The oracle checked on a graph with one known crossing and one known cycle.
    made_up = {"minddp.runtime.launch": {"minddp.train.config": 1}, "minddp.train.config": {"minddp.runtime.launch": 2}}
    assert crossings(made_up) == ["minddp.runtime.launch:1 (runtime) imports minddp.train.config (train)"]
    assert cycles(made_up) == [["minddp.runtime.launch", "minddp.train.config"]]
    # And the reader sees an import made inside a function (train.run imports the analysis command there).
    run = MODULES["minddp.train.run"].read_text()
    assert "            from minddp.analysis.__main__ import main as analyze_main" in run
    assert "minddp.analysis.__main__" in GRAPH["minddp.train.run"]


def clashes_in(init: Path) -> list[str]:
    """Names a package's ``__init__`` binds to something other than its module of the same name."""
    modules = {p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name for p in init.parent.iterdir() if (p / "__init__.py").exists()}
    package = init.parent.relative_to(PACKAGE.parent).as_posix().replace("/", ".")
    found = []
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                bound = a.asname or a.name
                the_module = (node.module == package or node.level == 1 and not node.module) and a.name == bound
                if bound in modules and not the_module:
                    found.append(f"{package}.{bound}")
        elif isinstance(node, ast.Assign):
            found += [f"{package}.{t.id}" for t in node.targets if isinstance(t, ast.Name) and t.id in modules]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in modules:
            found.append(f"{package}.{node.name}")
    return found


def test_no_package_binds_a_name_one_of_its_modules_has():
    # `from minddp.costmodel import predict` gave the function or the module predict.py, depending on whether
    # something had imported the module first (Python then rebinds the package's attribute to it): an order the
    # suite's two workers change from run to run. A package's names and its modules' must differ.
    clashes = [c for init in sorted(PACKAGE.rglob("__init__.py")) for c in clashes_in(init)]
    assert not clashes, "a package binds a name that is also one of its modules: " + ", ".join(clashes)
