"""The package's shape (docs/design.md, Layers): no import circles between modules (imports inside
functions count) nor between packages (every module folded into its first-level package:
gemref.x.y -> gemref.x, a technique's config module included), the layers hold (model/ sees
only model, attention, data, config; nothing below the entry points imports them; nothing but the entry points imports
a bench module), each config dataclass is defined in its technique's package, and the top level
stays small: at most MAX_TOP_LEVEL modules beside the packages."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gemref"
DESIGN = PACKAGE.parent / "docs" / "design.md"


def design_rows() -> list[tuple[int, str, list[str]]]:
    """(layer number, side "core"|"lab", backticked names) per row of docs/design.md's layer table
    (1 = foundations, the bottom)."""
    lines = DESIGN.read_text().split("<!-- layers:", 1)[1].splitlines()[1:]
    out = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not cells[0][:1].isdigit():
            continue                                   # the header and its rule
        out.append((int(cells[0].split()[0]), cells[1], cells[2].split("`")[1::2]))
    return out


def design_layers() -> dict[str, int]:
    """{"gemref.<name>": layer number} from docs/design.md's layer table."""
    return {f"gemref.{name}": number for number, _, names in design_rows() for name in names}


def design_sides() -> dict[str, str]:
    """{"gemref.<name>": "core" | "lab"} from docs/design.md's layer table."""
    return {f"gemref.{name}": side for _, side, names in design_rows() for name in names}


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


# Where each config dataclass is defined: its technique's config module, or gemref/train/ for
# what assembles a run. A reader copying a technique finds its settings beside its code
# (docs/design.md, "Where config lives"); this table keeps them from drifting back.
CONFIG_HOMES = {
    "ActivationCheckpointConfig": "gemref.autoac.config", "AttentionConfig": "gemref.attention.config",
    "BalanceConfig": "gemref.balance.config", "CheckpointConfig": "gemref.checkpoint.config",
    "CompileConfig": "gemref.compile.config", "DataConfig": "gemref.data.config", "DatasetFolder": "gemref.data.config",
    "EmbeddingConfig": "gemref.parallel.config", "MeshShape": "gemref.parallel.config",
    "ModelConfig": "gemref.model.config", "ParallelConfig": "gemref.parallel.config",
    "PrecisionConfig": "gemref.precision.config", "Preset": "gemref.train.presets", "TrainConfig": "gemref.train.config",
}
ASSEMBLY = ("gemref.train.config", "gemref.train.presets", "gemref.train.record", "gemref.train.override")
# gemref/config/ is the bottom layer: it imports nothing of gemref but gemref.errors. A technique's
# config module imports only it and gemref.errors (test_a_technique_config_module_imports_only_configs_helpers).
CONFIG_MODULE_IMPORTS = {"gemref.errors", "gemref.config.checks", "gemref.config.section", "gemref.config.values"}


def config_modules() -> set[str]:
    """The technique packages' config modules (gemref.<package>.config)."""
    return {home for home in CONFIG_HOMES.values() if home not in ASSEMBLY}


def first_level(module: str) -> str:
    """The first-level package a module belongs to: gemref.attention.cpu_fused.op ->
    gemref.attention, gemref.data.config -> gemref.data; top-level modules stay themselves."""
    return ".".join(module.split(".")[:2])


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into first-level packages (`first_level`)."""
    fold = first_level
    out: dict[str, set[str]] = {}
    for module, targets in edges.items():
        out.setdefault(fold(module), set()).update(fold(t) for t in targets if fold(t) != fold(module))
    return out


def test_no_circles_between_first_level_packages():
    """Folded into first-level packages (imports inside functions count), gemref has no circle:
    each package can be read, copied and tested with only the packages below it."""
    assert circles(packages(graph())) == []


def test_package_folding_finds_a_circle_the_modules_do_not_have():
    # a.x -> b.y and b.z -> a.w: no module circle, but packages a and b depend on each other
    edges = {"gemref.a.x": {"gemref.b.y"}, "gemref.b.y": set(), "gemref.b.z": {"gemref.a.w"}, "gemref.a.w": set()}
    assert circles(edges) == []
    assert circles(packages(edges)) == [["gemref.a", "gemref.b"]]


def test_package_folding_finds_the_old_config_circle():
    """The layout this package had: gemref/config/ held both the sections' helpers and the
    presets, which import data's section; data's modules took a Preset. Folded, config <-> data."""
    edges = {"gemref.config.presets": {"gemref.data.config", "gemref.config.section"},
             "gemref.config.section": set(), "gemref.data.config": {"gemref.config.section"},
             "gemref.data.batches": {"gemref.config.presets", "gemref.data.config"}}
    assert circles(edges) == []
    assert circles(packages(edges)) == [["gemref.config", "gemref.data"]]


def test_the_config_layer_imports_nothing_of_gemref_but_errors():
    edges = graph()
    assert {m: sorted(ts) for m, ts in edges.items() if first_level(m) == "gemref.config"
            and not all(t == "gemref.errors" or first_level(t) == "gemref.config" for t in ts)} == {}


MAX_TOP_LEVEL = 10


def test_top_level_is_small():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_each_config_class_is_defined_in_its_techniques_package():
    import importlib

    from gemref.train.config import sections

    assert sorted({cls.__name__ for cls in sections().values()} - set(CONFIG_HOMES)) == []   # a new section names its home
    where = {name: getattr(importlib.import_module(home), name).__module__ for name, home in CONFIG_HOMES.items()}
    assert {name: module for name, module in where.items() if module != CONFIG_HOMES[name]} == {}


LAZY_PACKAGES = ("gemref.attention", "gemref.autoac", "gemref.checkpoint", "gemref.compile", "gemref.data",
                 "gemref.train")


def test_every_name_a_lazy_package_exports_is_defined_where_it_says():
    """A package that loads its names on first use (gemref/runtime/lazy.py) names, for each, the
    module that defines it: each one resolves, and a name it does not export is an AttributeError."""
    import importlib

    import pytest

    for package in LAZY_PACKAGES:
        module = importlib.import_module(package)
        assert [n for n in module.__all__ if getattr(module, n) is None] == []
        assert set(module.__all__) <= set(dir(module))
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            getattr(module, "no_such_name")


def test_a_technique_config_module_imports_only_configs_helpers():
    edges = graph()
    assert {m: sorted(edges[m] - CONFIG_MODULE_IMPORTS) for m in config_modules()
            if edges[m] - CONFIG_MODULE_IMPORTS} == {}


def test_importing_the_config_loads_no_torch_and_nothing_above_the_foundations():
    """TrainConfig, the presets, the record's config, `override` and every section load without
    torch (`gemref train --help` stays cheap): above layer 1 only the assembly, the sections and
    their packages' __init__s load, and those import nothing heavy."""
    import subprocess
    import sys

    probe = (f"import sys, {', '.join(ASSEMBLY)}; "
             "print(' '.join(m for m in sys.modules if m == 'torch' or m.startswith('gemref.')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    layers = design_layers()
    light = set(ASSEMBLY) | config_modules() | {first_level(m) for m in config_modules() | set(ASSEMBLY)}
    assert "torch" not in loaded
    assert [m for m in loaded if m.startswith("gemref.") and m not in light and layer(m, layers) > 1] == []


def test_circle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]


def test_model_imports_only_what_is_below_it():
    allowed = {"gemref.model", "gemref.attention", "gemref.data", "gemref.config"}
    bad = [(m, t) for m, targets in graph().items() if first_level(m) == "gemref.model"
           for t in targets if first_level(t) not in allowed]
    assert bad == []


def layer(module: str, layers: dict[str, int]) -> int:
    """The layer of a module: that of its first-level package (or of itself, at the top level)."""
    return layers[first_level(module)] if module != "gemref" else 1


def test_the_design_layer_table_names_every_package_and_top_level_module():
    layers = design_layers()
    top = {".".join(m.split(".")[:2]) for m in module_files() if m != "gemref"}
    assert sorted(top - set(layers)) == [] and sorted(set(layers) - top) == []


def test_no_module_imports_a_layer_above_its_own():
    layers = design_layers()
    bad = [(m, t) for m, targets in graph().items() for t in targets if layer(t, layers) > layer(m, layers)]
    assert bad == []


def test_layer_rule_catches_a_planted_upward_import():
    layers = design_layers()
    assert layer("gemref.attention.api", layers) < layer("gemref.train.loop", layers) \
        < layer("gemref.bench.window", layers) < layer("gemref.walkthrough.book", layers) \
        < layer("gemref.commands.train", layers)
    edges = {"gemref.data.jagged": {"gemref.train.loop"}}     # data reaching up into the loop
    assert [(m, t) for m, ts in edges.items() for t in ts if layer(t, layers) > layer(m, layers)] != []


def test_modules_stay_readable():
    long = {name: n for name, path in module_files().items()
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def design_techniques(text: str | None = None) -> list[dict[str, list[str]]]:
    """The rows of docs/design.md's technique table ("One technique, one place"): per row the
    backticked names of each column (package, config section, switches, chapter, benchmark, tests)."""
    text = DESIGN.read_text() if text is None else text
    lines = text.split("<!-- techniques:", 1)[1].splitlines()[1:]
    header = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append({name: cell.split("`")[1::2] for name, cell in zip(header, cells)} | {"technique": [cells[0]]})
    return rows


def missing_in_technique_table(rows: list[dict[str, list[str]]]) -> list[str]:
    """What the table names that does not exist: packages, config modules and test files (paths
    from the repository root), chapters (notebooks/<name>.ipynb), benchmarks (`gemref bench`
    names), config sections (TrainConfig fields that are sections) and switches (each one of its
    row's section)."""
    from gemref.bench import bench_names
    from gemref.train.config import sections, switch_fields_of

    root = PACKAGE.parent
    missing = []
    for row in rows:
        what = row["technique"][0]
        section_cell = row["config section (`TrainConfig` field, module)"]
        modules, named = [c for c in section_cell if c.endswith(".py")], [c for c in section_cell if "." not in c]
        missing += [f"{what}: {p}" for p in row["package"] + modules + row["tests"] if not (root / p).exists()]
        missing += [f"{what}: chapter {c}" for c in row["chapter"] if not (root / "notebooks" / f"{c}.ipynb").exists()]
        missing += [f"{what}: bench {b}" for b in row["benchmark"] if b not in bench_names()]
        missing += [f"{what}: section {n}" for n in named if n not in sections()]
        switches = {flag for n in named if n in sections() for flag in switch_fields_of(n)}
        missing += [f"{what}: switch {f}" for f in row["switches (command line, `override`)"] if f not in switches]
        missing += [f"{what}: no package"] * (not row["package"]) + [f"{what}: no tests"] * (not row["tests"])
    return missing


def test_the_technique_table_names_what_exists():
    rows = design_techniques()
    assert len(rows) >= 9 and missing_in_technique_table(rows) == []


def test_the_technique_table_check_finds_a_moved_package():
    """A row naming the old gemref/compile.py, a config module, a chapter, a bench and a section
    that do not exist, and switches no section has or another section holds, is caught on each."""
    text = ("<!-- techniques: x -->\n| technique | package | config section (`TrainConfig` field, module) | "
            "switches (command line, `override`) | chapter | benchmark | tests |\n"
            "|---|---|---|---|---|---|---|\n| compile | `gemref/compile.py` | `compiling` (`gemref/config/compiling.py`) "
            "| `compile_mode` | `04_compile` | `compiled` | `tests/test_compile.py` |\n"
            "| balance | `gemref/balance/` | `balancing` (`gemref/balance/config.py`) | `ac` | | | `tests/test_balance.py` |\n")
    assert missing_in_technique_table(design_techniques(text)) == [
        "compile: gemref/compile.py", "compile: gemref/config/compiling.py", "compile: chapter 04_compile",
        "compile: bench compiled", "compile: section compiling", "compile: switch compile_mode",
        "balance: switch ac"]


ENTRY_POINTS = ("gemref.cli", "gemref.__main__", "gemref.commands", "gemref.bench")
BENCH_IMPORT = re.compile(r"^\s*(?:from\s+gemref\.bench\b|import\s+gemref\.bench\b|from\s+gemref\s+import\s+bench\b)",
                          re.M)


def bench_importers(edges: dict[str, set[str]], texts: dict[str, str]) -> list[str]:
    """Who imports a bench module but is not an entry point: package modules (from `edges`) and
    notebooks or scripts (their code, from `texts`)."""
    def entry(name: str) -> bool:
        return any(name == e or name.startswith(e + ".") for e in ENTRY_POINTS)
    out = [name for name, targets in edges.items()
           if not entry(name) and any(t == "gemref.bench" or t.startswith("gemref.bench.") for t in targets)]
    return sorted(out + [where for where, code in texts.items() if BENCH_IMPORT.search(code)])


def notebook_and_script_code() -> dict[str, str]:
    root, out = PACKAGE.parent, {}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        out[str(path.relative_to(root))] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for path in sorted((root / "scripts").rglob("*.py")):
        out[str(path.relative_to(root))] = path.read_text()
    return out


def test_only_the_entry_points_import_a_bench_module():
    """bench/ modules are thin commands (docs/design.md): the measurements they print live in the
    packages, and a chapter, a script or another package calls those, never a command module."""
    assert bench_importers(graph(), notebook_and_script_code()) == []


def test_the_bench_import_check_finds_planted_importers():
    edges = {"gemref.walkthrough.best_rung": {"gemref.bench.step_profile"}, "gemref.commands.bench": {"gemref.bench"},
             "gemref.bench.compile": {"gemref.measure.compile_steps"}, "gemref.mfu.timing": {"gemref.config"}}
    texts = {"notebooks/04.ipynb": "x = 1\nfrom gemref.bench.compile import compare_steps", "scripts/a.py": "import gemref.benchmarks",
             "notebooks/05.ipynb": "  import gemref.bench.autoac as b"}
    assert bench_importers(edges, texts) == ["gemref.walkthrough.best_rung", "notebooks/04.ipynb", "notebooks/05.ipynb"]


def test_the_core_sits_below_the_lab():
    rows = design_rows()
    assert {side for _, side, _ in rows} == {"core", "lab"}
    assert max(n for n, side, _ in rows if side == "core") < min(n for n, side, _ in rows if side == "lab")


def lab_imports(edges: dict[str, set[str]], sides: dict[str, str]) -> list[tuple[str, str]]:
    """(core module, lab module) for every import from the core into the lab."""
    side = lambda m: sides[".".join(m.split(".")[:2])] if m != "gemref" else "core"  # noqa: E731
    return [(m, t) for m, targets in edges.items() for t in targets if side(m) == "core" and side(t) == "lab"]


def test_the_core_never_imports_the_lab():
    assert lab_imports(graph(), design_sides()) == []


def test_core_lab_rule_catches_a_planted_import():
    edges = {"gemref.train.loop": {"gemref.report.records"}, "gemref.report.records": {"gemref.train.metrics"}}
    assert lab_imports(edges, design_sides()) == [("gemref.train.loop", "gemref.report.records")]


def test_importing_the_training_loop_loads_no_lab_module():
    import subprocess
    import sys

    probe = "import sys, gemref.train.loop; print(' '.join(m for m in sys.modules if m.startswith('gemref.')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    sides = design_sides()
    assert [m for m in loaded if sides[".".join(m.split(".")[:2])] == "lab"] == []


# A code-size budget, not a speed bound: what the loop and the composition load (gemref.train's
# train and setup, `import gemref.train.loop`) stays a reader's size.
# The kernels' sources (cpu_fused, cpu_jagged, triton) are not counted; optional and CPU-only
# paths (the CPU GEMM work, MX emulation, checkpoints, data generation, AutoAC, TorchRec, the
# sharding, compile's planning) are imported where they are used, not by the import.
TRAIN_IMPORT_MAX_LINES = 7_000
KERNEL_SOURCES = re.compile(r"/gemref/attention/(cpu_fused|cpu_jagged|triton)/")


def counted_lines(files: dict[str, str]) -> dict[str, int]:
    """{module: lines} of the given {module: source file}, the kernels' sources left out."""
    return {name: len(Path(path).read_text().splitlines(keepends=True))
            for name, path in files.items() if not KERNEL_SOURCES.search(Path(path).as_posix())}


def test_importing_the_training_loop_loads_at_most_the_line_budget():
    import subprocess
    import sys

    probe = ("import json, sys, gemref.train.loop; print(json.dumps({n: m.__file__ for n, m in list(sys.modules.items()) "
             "if n.split('.')[0] == 'gemref' and getattr(m, '__file__', None)}))")
    files = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      check=True).stdout)
    lines = counted_lines(files)
    top = "\n".join(f"{n:6d} {name}" for name, n in sorted(lines.items(), key=lambda kv: -kv[1])[:25])
    assert sum(lines.values()) <= TRAIN_IMPORT_MAX_LINES, \
        f"import gemref.train.loop loads {sum(lines.values()):,} lines of gemref (budget {TRAIN_IMPORT_MAX_LINES:,}):\n{top}"


def test_the_line_budget_leaves_out_only_the_kernels_sources():
    files = {"gemref.train.loop": str(PACKAGE / "train" / "loop.py"),
             "gemref.attention.triton.op": str(PACKAGE / "attention" / "triton" / "op.py"),
             "gemref.attention.sdpa": str(PACKAGE / "attention" / "sdpa.py")}
    assert set(counted_lines(files)) == {"gemref.train.loop", "gemref.attention.sdpa"}
    assert counted_lines(files)["gemref.train.loop"] == len((PACKAGE / "train" / "loop.py").read_text().splitlines())


# What a reader copies to take one technique into their own trainer, and its line budget (about
# 400 lines, at most two files; docs/design.md, "Where things moved (the reference layout)"). The
# switches (<package>/config.py) and a package's __init__ stay out: gemref's, not the technique's.
TECHNIQUE_FILES = {
    "autoac": (("autoac/profile.py", "autoac/plan.py"), 400),
    "load balancing": (("balance/cost.py", "balance/partition.py"), 400),
    "float8 / MXFP8": (("precision/apply.py", "precision/torchao_layers.py"), 400),
    "activation compression": (("activation_compression.py",), 400),
    "regional compile": (("compile/apply.py", "compile/regions.py"), 400),
    "FSDP2 on a 2D mesh": (("parallel/fsdp.py", "parallel/parallelize.py"), 400),
    "sharded tables": (("parallel/sparse.py",), 400),
    "row-wise table optimizers": (("parallel/rowwise.py",), 400),
}
# FSDP2 2D and the sharded tables together: parallel may take more than one technique's budget.
PARALLEL = ("FSDP2 on a 2D mesh", "sharded tables")
PARALLEL_BUDGET = 600


def test_each_technique_fits_its_line_budget():
    over = []
    for technique, (files, budget) in TECHNIQUE_FILES.items():
        lines = {f: len((PACKAGE / f).read_text().splitlines()) for f in files}
        assert len(files) <= 2, f"{technique}: a reader opens at most two files, the table lists {files}"
        if sum(lines.values()) > budget:
            over.append(f"{technique}: {sum(lines.values())} lines > {budget}: "
                        + ", ".join(f"gemref/{f} {n}" for f, n in lines.items()))
    parallel = {f: len((PACKAGE / f).read_text().splitlines()) for t in PARALLEL for f in TECHNIQUE_FILES[t][0]}
    if sum(parallel.values()) > PARALLEL_BUDGET:
        over.append(f"FSDP2 2D + sharded tables: {sum(parallel.values())} lines > {PARALLEL_BUDGET}: "
                    + ", ".join(f"gemref/{f} {n}" for f, n in parallel.items()))
    assert not over, "\n".join(over)
