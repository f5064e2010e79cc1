"""The package's layers read bottom-up: a module never imports one of a higher layer, not even lazily inside a
function. The step's shared types (step/: Sequence, Proposal, StepStats, the runner) sit below the drafters and
the controllers, which sit below the engine: the engine imports them, and nothing imports the engine back. And no
two modules import each other, directly or round a circle (three such circles were each closed by an import
inside a function: bench/llama_cpp_peer.py and bench/specbench.py; bench/sweep.py, sweep_peers.py and
sweep_report.py; train/distill.py and train/heads.py).

Checked on the source (every `import` statement, at any depth), so a violation is caught without running it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import specdecode

PACKAGE = Path(specdecode.__file__).resolve().parent

# Lowest first. A module's layer is its first dotted component under specdecode (a package or a top module).
LAYERS: list[set[str]] = [
    {"config", "arms", "atomic_dir", "hardware", "prompts", "detokenize", "kv", "grammar", "verify", "models",
     "assets", "free_memory", "huge_pages"},
    {"heads"},
    {"step"},
    {"drafters", "control"},
    {"engine"},
    {"llm"},
    {"llm_args"},
    {"cli", "server", "bench", "train", "demo", "__init__", "__main__"},
]  # fmt: skip


def layer_of(name: str) -> int:
    """The layer of a dotted module name under specdecode ("specdecode.engine.engine" -> the engine's)."""
    top = name.split(".")[1] if "." in name else "__init__"
    return next(i for i, names in enumerate(LAYERS) if top in names)


def imports_of(path: Path) -> list[str]:
    """Every specdecode module the file imports, anywhere in it (`from specdecode.x import y` names x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n for n in names if n == "specdecode" or n.startswith("specdecode.")]


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("specdecode", *parts))


def upward_imports(root: Path) -> list[str]:
    """'importer -> imported' for every import of a higher layer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(root, path)
        for name in imports_of(path):
            if name != "specdecode" and layer_of(name) > layer_of(me):
                found.append(f"{me} -> {name}")
    return found


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(PACKAGE, path))  # StopIteration: a new top-level module needs a place in LAYERS


def test_no_module_imports_a_higher_layer():
    assert upward_imports(PACKAGE) == []


def test_a_lazy_upward_import_is_caught(tmp_path):
    """Negative control: the same check on a copy of the package where a drafter imports the LLM inside a
    function (the way drafters/layer_select.py used to)."""
    root = tmp_path / "specdecode"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    ngram = root / "drafters" / "ngram.py"
    lazy = "\n\ndef _calibrate():\n    from specdecode.llm import LLM\n\n    return LLM\n"
    ngram.write_text(ngram.read_text() + lazy)
    assert upward_imports(root) == ["specdecode.drafters.ngram -> specdecode.llm"]


def test_a_controller_importing_the_engine_is_caught(tmp_path):
    """Negative control: a controller reaches back into the engine for a type (as control/ did for Sequence when
    it lived in engine/sequence.py)."""
    root = tmp_path / "specdecode"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    fixed = root / "control" / "fixed.py"
    fixed.write_text(fixed.read_text() + "\n\nfrom specdecode.engine.engine import Engine  # noqa: E402\n")
    assert upward_imports(root) == ["specdecode.control.fixed -> specdecode.engine.engine"]


def module_imports(root: Path, path: Path) -> set[str]:
    """The modules under root the file imports, anywhere in it; `from specdecode.x import y` names
    specdecode.x.y when y is a module, else specdecode.x."""
    modules = {dotted(root, p) for p in root.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = (f"{node.module}.{a.name}" for a in node.names)
            found |= {n if n in modules else node.module for n in names}
    return {n for n in found if n in modules}


def dotted(root: Path, path: Path) -> str:
    """specdecode/bench/sweep.py -> specdecode.bench.sweep; a package's __init__.py is the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("specdecode", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def import_circles(root: Path) -> list[list[str]]:
    """Every set of two or more modules that import each other round a circle (strongly connected components)."""
    graph = {dotted(root, p): module_imports(root, p) for p in sorted(root.rglob("*.py"))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v] - {v}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    assert import_circles(PACKAGE) == []


def test_a_lazy_import_circle_is_caught(tmp_path):
    """Negative control: the heads' trainer imports the draft trainer inside a function again, as it used to
    (train/distill.py imports train/heads.py)."""
    root = tmp_path / "specdecode"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    heads = root / "train" / "heads.py"
    lazy = "\n\ndef _result():\n    from specdecode.train.distill import DistillConfig\n\n    return DistillConfig\n"
    heads.write_text(heads.read_text() + lazy)
    assert import_circles(root) == [["specdecode.train.distill", "specdecode.train.heads"]]
