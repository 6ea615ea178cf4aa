"""The package's shape: no import circles (imports inside functions count), and the layers of
docs/design.md hold: model/ sees only model, attention, data and config; nothing below the
entry points imports them; nothing but the entry points imports a bench module."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gemref"
ENTRY_POINTS = ("gemref.cli", "gemref.commands", "gemref.__main__", "gemref.waterfall", "gemref.notebooks", "gemref.bench",
                "gemref.book", "gemref.chapter")   # book: `gemref notebooks build`; chapter: what notebooks call
# Modules that run a training step to check something, and so sit above gemref.train.
ABOVE_TRAIN = ("gemref.mfu.verify", "gemref.simulate.validate", "gemref.run_ranks")


def module_files() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every gemref module `name` imports, at module level or inside a function."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:   # `from pkg import name`: the module that defines it
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    edges = {name: imports_of(name, path, set(files)) for name, path in files.items()}
    # A package's __init__ importing its own submodules (or a submodule its package) is not a circle.
    for name, targets in edges.items():
        edges[name] = {t for t in targets if not t.startswith(name + ".") and not name.startswith(t + ".")}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circles():
    assert circles(graph()) == []


def test_circle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]


def test_model_imports_only_what_is_below_it():
    allowed = ("gemref.model", "gemref.attention", "gemref.data", "gemref.config")
    bad = [(m, t) for m, targets in graph().items() if m.startswith("gemref.model")
           for t in targets if not t.startswith(allowed)]
    assert bad == []


def test_lower_layers_never_import_train_or_the_entry_points():
    edges = graph()
    upper = ENTRY_POINTS + ("gemref.train",) + ABOVE_TRAIN
    bad = []
    for module, targets in edges.items():
        if module.startswith(upper) or module == "gemref":
            continue
        bad += [(module, t) for t in targets if t.startswith(upper) and not
                (t.startswith("gemref.train") and module.startswith(ABOVE_TRAIN))]
    # Only entry points (and the bench package itself) import bench modules.
    bad += [(m, t) for m, targets in edges.items() for t in targets
            if t.startswith("gemref.bench") and not m.startswith(ENTRY_POINTS)]
    assert bad == []


def test_modules_stay_readable():
    long = {name: n for name, path in module_files().items()
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}
