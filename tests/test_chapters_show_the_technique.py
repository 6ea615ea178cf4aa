"""Each technique chapter shows the technique before it measures it: at least one code cell
imports only gemref's core (the modules a reader's own trainer would import, never the lab's
measuring modules: gemref.measure, bench, walkthrough, report, waterfall, simulate) and calls a
gemref API itself, forward and backward. Read from the committed notebook JSON, not executed
(tests/test_notebooks.py runs the chapters)."""
from __future__ import annotations

import ast
import json

import pytest

from gemref.walkthrough.params import NOTEBOOK_DIR

# The core a trainer imports (docs/design.md, layers 1-6), as the chapters' by-hand cells use it;
# of gemref.mfu only the FLOP counts, the meter, the peaks and the timer.
CORE_PACKAGES = {"data", "model", "attention", "compile", "autoac", "balance", "parallel", "precision", "train",
                 "config"}
CORE_MFU = {"flops", "meter", "peak", "timing"}
# the chapters held to it (every technique chapter); of them, those that show it before any cell measures it
# (06 times the cost model against measured steps, section 1b, before its loss-rule cell)
ASSERTED = ["01_jagged_batches", "02_flash_attention", "03_gdpa", "04_torch_compile", "05_autoac",
            "06_load_balancing", "07_fsdp_2d", "08_communication", "09_mxfp8"]
BEFORE_MEASURING = [name for name in ASSERTED if name != "06_load_balancing"]
MEASURING = ("gemref.measure", "gemref.bench", "gemref.waterfall", "gemref.simulate", "gemref.mfu.attention_cost")


def is_core(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "gemref" or len(parts) < 2:
        return False
    if parts[1] == "mfu":
        return len(parts) >= 3 and parts[2] in CORE_MFU
    return parts[1] in CORE_PACKAGES


def gemref_imports(tree: ast.AST) -> dict[str, str]:
    """Every name a cell binds from gemref -> the module it comes from ("gemref.x.y" or "gemref.x.y.Name")."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gemref":
                    bound[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gemref":
            for a in node.names:   # `from gemref import data` names a package; `from gemref.x import f` a function
                bound[a.asname or a.name] = f"{node.module}.{a.name}" if node.module == "gemref" else node.module
    return bound


def uses_technique(source: str) -> str | None:
    """None if the cell imports only core modules, calls one of them and runs backward; else why not."""
    try:
        tree = ast.parse(source)
    except SyntaxError:                    # IPython magics: not a plain trainer's code
        return "not plain Python"
    bound = gemref_imports(tree)
    if not bound:
        return "imports nothing from gemref"
    if lab := sorted({m for m in bound.values() if not is_core(m)}):
        return f"imports {lab}"
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            root = node.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                called.add(root.id)
    if not called:
        return "calls no gemref API"
    if ".backward(" not in source and "autograd.grad(" not in source:
        return "runs no backward"
    return None


def code_cells(name: str) -> list[dict]:
    raw = json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())
    return [c for c in raw["cells"] if c["cell_type"] == "code"]


def technique_cells(name: str) -> tuple[list[str], list[str]]:
    """(ids of the cells that show the technique, why each other gemref-importing cell does not)."""
    shown, why = [], []
    for cell in code_cells(name):
        reason = uses_technique("".join(cell["source"]))
        if reason is None:
            shown.append(cell["id"])
        elif reason != "imports nothing from gemref":
            why.append(f"{cell['id']}: {reason}")
    return shown, why


def first_measuring_cell(name: str) -> str | None:
    for cell in code_cells(name):
        try:
            modules = gemref_imports(ast.parse("".join(cell["source"]))).values()
        except SyntaxError:
            continue
        if any(m == p or m.startswith(p + ".") for m in modules for p in MEASURING):
            return cell["id"]
    return None


def test_the_checker_tells_core_from_lab():
    assert uses_technique("from gemref.attention import gdpa\nout = gdpa(q, k, v, o)\nout.sum().backward()") is None
    assert uses_technique("import gemref.autoac\np = gemref.autoac.solve(x, 1)\nloss.backward()") is None
    assert uses_technique("from gemref.mfu.flops import model_flops\nmodel_flops(c, l)\nl.backward()") is None
    assert "imports" in uses_technique("from gemref.measure.run import run\nrun(p)\nx.backward()")
    assert "imports" in uses_technique("from gemref.mfu.attention_cost import compare_kernels\ncompare_kernels()")
    assert "imports" in uses_technique("from gemref import walkthrough\nwalkthrough.show()\nx.backward()")
    assert uses_technique("from gemref.model.gem import GEMRef\nx.backward()") == "calls no gemref API"
    assert uses_technique("from gemref.model.gem import GEMRef\nm = GEMRef(c)") == "runs no backward"
    assert uses_technique("import torch\ntorch.ones(1)") == "imports nothing from gemref"


@pytest.mark.parametrize("name", ASSERTED)
def test_chapter_shows_its_technique_with_core_modules(name):
    shown, why = technique_cells(name)
    assert shown, (f"{name}: no code cell imports only gemref's core and runs the technique forward and backward "
                   f"(add one after the idea, before the measurements); cells that import gemref: {why}")


@pytest.mark.parametrize("name", BEFORE_MEASURING)
def test_chapter_shows_its_technique_before_measuring_it(name):
    ids = [c["id"] for c in code_cells(name)]
    shown, _ = technique_cells(name)
    measuring = first_measuring_cell(name)
    assert shown and (measuring is None or ids.index(shown[0]) < ids.index(measuring)), \
        f"{name}: the first cell that shows the technique ({shown[:1]}) must come before the first measuring cell ({measuring})"

