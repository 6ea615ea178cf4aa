"""A notebook's parameters: the names and defaults of its `parameters` cell, and values checked
against them.

The cell is read with `ast` (papermill's own reader skips any line with two '=' in it, such
as `RANKS = 1  # 1, or >= 2`, and warns). A value must have the type of the declared
default: bool, int, float (an int is accepted), str, or a list whose items have the type of
the default's items; a default of None, or one that is not a literal, accepts anything. None
is accepted for any parameter (the notebooks use it for "the preset's value" and say so).
Values from the command line (`--param NAME=TEXT`) are parsed by that type (gemref/fields.py
for scalars, a YAML flow list like [8, 64] for lists); None/null gives None unless the
default is a string.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .fields import has_type, parse_as

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
