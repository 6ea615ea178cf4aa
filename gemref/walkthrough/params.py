"""A notebook's parameters: the names and defaults of its `parameters` cell, and values checked
against them.

The cell is read with `ast` (papermill's own reader skips any line with two '=' in it, such
as `RANKS = 1  # 1, or >= 2`, and warns). A value must have the type of the declared
default: bool, int, float (an int is accepted), str, or a list whose items have the type of
the default's items; a default of None, or one that is not a literal, accepts anything. None
is accepted for any parameter (the notebooks use it for "the preset's value" and say so).
Values from the command line (`--param NAME=TEXT`) are parsed by that type (gemref/config/values.py
for scalars, a YAML flow list like [8, 64] for lists); None/null gives None unless the
default is a string.
"""
from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError
from ..config.values import has_type, parse_as

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
ANY = object()   # the default of a parameter whose value is not a Python literal


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """{name: default} assigned in the cell tagged `parameters` (empty without one)."""
    nb = json.loads(Path(notebook).read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            out = {}
            for node in ast.parse("".join(cell["source"])).body:
                target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
                    node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None)
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[target.id] = ANY
            return out
    return {}


def _item_type(default: list) -> type | None:
    kinds = {type(v) for v in default}
    if kinds == {int, float}:
        return float
    return kinds.pop() if len(kinds) == 1 and kinds <= {bool, int, float, str} else None


def _describe(default: Any) -> str:
    if isinstance(default, list):
        item = _item_type(default)
        return f"a list of {item.__name__}" if item else "a list"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}[type(default)]


def _matches(value: Any, default: Any) -> bool:
    if value is None or default is None or default is ANY:
        return True
    if isinstance(default, list):
        item = _item_type(default)
        return isinstance(value, list) and (item is None or all(has_type(v, item) for v in value))
    if type(default) in (bool, int, float, str):
        return has_type(value, type(default))
    return isinstance(value, type(default))


def check_params(notebook: str, params: dict[str, Any], declared: dict[str, Any]) -> None:
    """UsageError for a name the notebook does not declare or a value of the wrong type."""
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise UsageError(f"{notebook}: unknown parameter(s) {unknown}; it declares {', '.join(sorted(declared))}")
    for name, value in params.items():
        if not _matches(value, declared[name]):
            raise UsageError(f"{notebook}: parameter {name}={value!r} should be {_describe(declared[name])} "
                             f"(its default is {declared[name]!r})")


def parse_param(name: str, text: str, default: Any) -> Any:
    """`--param name=text` as a value of the default's type (UsageError otherwise)."""
    what = f"--param {name}"
    if text.strip() in ("None", "none", "null") and not isinstance(default, str):
        return None
    if isinstance(default, (bool, int, float, str)):
        return parse_as(type(default), text, what)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{what}={text}: not a value ({problem})") from None
    if isinstance(default, list) and not _matches(value, default):
        raise UsageError(f"{what} expects {_describe(default)} like {default!r}, got {text!r}")
    return value


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file the user named; UsageError naming the file (and the line of a parse error)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"{what} {path}: no such file") from None
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it ({e.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{what} {path}:{where} invalid YAML: {problem}") from None


def load_grid(path: str | Path) -> dict:
    """The --grid file: a mapping parameter -> list of values."""
    grid = read_yaml(Path(path), "--grid")
    if not isinstance(grid, dict):
        raise UsageError(f"--grid {path}: a grid is a mapping of parameter -> list of values")
    return grid


def load_profile(profile: str, params_dir: Path | None = None) -> dict:
    """{"global": {...}, "notebooks": {name: {...}}} from notebooks/params/<profile>.yaml."""
    params_dir = params_dir or NOTEBOOK_DIR / "params"
    path = params_dir / f"{profile}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in params_dir.glob("*.yaml"))
        raise UsageError(f"unknown profile {profile!r}; valid: {', '.join(valid)}")
    data = read_yaml(path, "profile") or {}
    unknown = set(data) - {"global", "notebooks", "budget_s", "budgets"} if isinstance(data, dict) \
        else {"(not a mapping)"}
    if unknown:
        raise UsageError(f"{path}: unknown top-level keys {sorted(unknown)}; expected global, notebooks, "
                         "budget_s, budgets")
    budgets = data.get("budgets") or {}
    for key, value in [("budget_s", data.get("budget_s")), *((f"budgets.{k}", v) for k, v in budgets.items())]:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise UsageError(f"{path}: {key} must be a positive number of CPU seconds, got {value!r}")
    return {"global": data.get("global") or {}, "notebooks": data.get("notebooks") or {},
            "budget_s": data.get("budget_s"), "budgets": budgets}


def profile_params(profile: str, name: str, notebook_dir: Path | None = None) -> dict:
    """The parameters a profile gives one notebook: the globals it declares, then its own."""
    notebook_dir = notebook_dir or NOTEBOOK_DIR
    prof = load_profile(profile, notebook_dir / "params")
    declared = declared_parameters(notebook_dir / f"{name}.ipynb")
    return {**{k: v for k, v in prof["global"].items() if k in declared}, **prof["notebooks"].get(name, {})}


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """{"A": [1, 2], "B": [3]} -> [{"A": 1, "B": 3}, {"A": 2, "B": 3}]."""
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UsageError(f"grid entry {key!r} must be a non-empty list, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))] or [{}]


def select_notebooks(names: list[str] | None, notebook_dir: Path | None = None) -> list[Path]:
    """The numbered notebooks of the folder, or the named ones (UsageError for an unknown name)."""
    available = sorted((notebook_dir or NOTEBOOK_DIR).glob("[0-9]*.ipynb"))
    if not names:
        return available
    by_name = {p.stem: p for p in available}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UsageError(f"unknown notebook(s) {missing}; valid: {', '.join(by_name)}")
    return [by_name[n] for n in names]


def parse_params(texts: dict[str, str], notebooks: list[Path]) -> dict[str, Any]:
    """--param values (text) typed by the default of the first of `notebooks` declaring each."""
    declared = [declared_parameters(nb) for nb in notebooks]
    out = {}
    for name, text in texts.items():
        defaults = [d[name] for d in declared if name in d]
        if not defaults:
            known = sorted(set().union(*declared))
            raise UsageError(f"unknown parameter {name!r}; the selected notebooks declare {', '.join(known)}")
        out[name] = parse_param(name, text, defaults[0])
    return out
