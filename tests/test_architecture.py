"""The house's shape, checked from the source: imports only go down between the top-level
packages, no module import circle anywhere, and private keras / keras-hub / Beam names only in
`pipeline/compat.py`. Reads the code (ast, grep); imports nothing of it."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"chatlens": 0, "localpubsub": 1, "pipeline": 2, "app": 2, "bench": 3, "cli": 4}
"""A package imports only packages on a lower layer (and itself): chatlens, the shared base, at
the bottom; the Pub/Sub server on it; the pipeline and the dashboard side by side, never
importing each other; the benchmarks over them; the `chatlens` command on top."""


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, at module level or inside functions alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_imports_only_go_down_between_top_level_packages():
    upward = sorted(f"{name} -> {target}" for name, targets in graph().items() for target in targets
                    if (a := name.split(".")[0]) != (b := target.split(".")[0]) and LAYERS[b] >= LAYERS[a])
    assert not upward, "imports that go up or sideways between top-level packages:\n" + "\n".join(upward)


def test_no_module_import_circle():
    """No module reaches itself through imports (Tarjan's strongly connected components)."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"


def test_the_model_packages_import_no_higher_job():
    """Inside pipeline/model: loading a model for serving imports no trainer, and nothing in the
    model package imports the pipeline's commands or transforms."""
    edges = graph()
    serving = {"pipeline.model.loading.sources", "pipeline.model.backends.gemma.engine",
               "pipeline.model.backends.gemma.handler"}
    reached, todo = set(), list(serving)
    while todo:
        for target in edges[todo.pop()]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert "pipeline.model.training.trainer" not in reached
    commands = {"pipeline.tune", "pipeline.evaluate", "pipeline.batch", "pipeline.streaming", "pipeline.graph"}
    wrong = sorted(f"{name} -> {target}" for name, targets in edges.items() if name.startswith("pipeline.model")
                   for target in targets if target in commands or target.startswith("pipeline.transforms"))
    assert not wrong, wrong


PRIVATE = re.compile(
    r"\bkeras(?:_hub)?\.src\b"  # keras's and keras-hub's internal module trees
    r"|from\s+(?:keras|keras_hub|apache_beam)[\w.]*\s+import\s+(?:\([^)]*)?\b_[A-Za-z]"  # a private name imported
    r"|\b(?:keras|keras_hub|apache_beam)(?:\.\w+)*\._[A-Za-z]\w*"  # a private attribute of the libraries
)


def test_private_third_party_names_only_in_compat():
    """Every private keras / keras-hub / Beam name lives in pipeline/compat.py (pinned there, each
    checked by tests/pipeline/test_compat.py); a grep for the names it lists and for the shapes of
    private access finds none anywhere else."""
    from pipeline.compat import PRIVATE_NAMES

    listed = re.compile("|".join(rf"(?<![\w.]){re.escape(n)}\b" if n[0] != "_" else rf"\.{re.escape(n)}\b|\bimport\s+{re.escape(n)}\b"
                                 for n in PRIVATE_NAMES))
    found = []
    for package in [*LAYERS, "deploy"]:
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "pipeline" / "compat.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PRIVATE.search(line) or listed.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "private keras / keras-hub / Beam names outside pipeline/compat.py:\n" + "\n".join(found)


def test_the_grep_finds_each_shape_of_private_access():
    """The grep above catches what it must."""
    for line in ("from keras.src.backend.common import global_state",
                 "from apache_beam.runners.direct.direct_runner import _DirectReadFromPubSub",
                 "x = apache_beam.io._private", "import keras_hub.src.models"):
        assert PRIVATE.search(line), line
    assert not PRIVATE.search("from apache_beam.ml.inference.base import KeyedModelHandler")
