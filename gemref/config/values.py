"""Typed values of config dataclass fields: parse a user's string by the field's declared type,
and check that a value has it.

The declared types the config dataclasses use are int, float, bool, str, tuple[int, ...],
int | None, and (checked, never parsed from text) a dataclass, such as TrainConfig's sections:
    int     decimal integers ("12", "-3"); "1.5" and "abc" are errors
    int | None  an integer as above, or "none" (any case) for None
    float   finite numbers ("0.001", "1e-3", "2"); "nan", "inf" and "abc" are errors
    bool    true/false, 1/0, yes/no (any case); anything else is an error
    str     the text as given
    tuple[int, ...]  integers separated by commas, optionally in [] or (): "[8, 64]", "8,64"
Errors are UsageErrors naming the field, the expected type and the value given.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from dataclasses import fields
from typing import Any, Callable

from ..errors import UsageError

BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
INT_TUPLE = tuple[int, ...]
OPTIONAL_INT = int | None
_EXPECTED = {int: "an integer", float: "a finite number", bool: "a boolean (true/false, 1/0, yes/no)",
             str: "a string", INT_TUPLE: "a list of integers like [8,64]",
             OPTIONAL_INT: "an integer or none"}


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """{field name: declared type} of a dataclass (string annotations resolved)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def expected(tp: Any) -> str:
    """'an integer', 'a finite number', ... for an error message."""
    if dataclasses.is_dataclass(tp):
        return f"a {tp.__name__}"
    if tp not in _EXPECTED:
        raise TypeError(f"no parser for declared type {tp!r}; supported: int, float, bool, str, "
                        "tuple[int, ...], int | None")
    return _EXPECTED[tp]


def _int(text: str) -> int:
    return int(text.strip(), 10)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not finite")
    return value


def _bool(text: str) -> bool:
    return BOOL_WORDS[text.strip().lower()]


def _int_tuple(text: str) -> tuple[int, ...]:
    body = text.strip()
    pairs = {"[": "]", "(": ")"}
    if body[:1] in pairs:
        if body[-1:] != pairs[body[0]]:
            raise ValueError("unclosed bracket")
        body = body[1:-1]
    items = [item.strip() for item in body.split(",")]
    if items and items[-1] == "" and len(items) > 1:     # one trailing comma, as in (8,)
        items.pop()
    if items == [""]:
        return ()
    return tuple(_int(item) for item in items)


def _optional_int(text: str) -> int | None:
    return None if text.strip().lower() == "none" else _int(text)


_PARSERS = {int: _int, float: _float, bool: _bool, str: str, INT_TUPLE: _int_tuple, OPTIONAL_INT: _optional_int}


def parse_as(tp: Any, text: str, what: str = "") -> Any:
    """`text` converted to type `tp`; a UsageError saying `what` expects which type otherwise."""
    description = expected(tp)
    try:
        return _PARSERS[tp](text)
    except (ValueError, KeyError):
        said = f"{what} expects" if what else "expected"
        raise UsageError(f"{said} {description}, got {text!r}") from None


def parse_field(cls: type, name: str, text: str) -> Any:
    """The value of dataclass field `name` written as `text` (UsageError: unknown field, bad value)."""
    types = field_types(cls)
    if name not in types:
        raise UsageError(f"unknown {cls.__name__} field {name!r}; valid: {', '.join(sorted(types))}")
    return parse_as(types[name], text, f"{cls.__name__}.{name}")


def has_type(value: Any, tp: Any) -> bool:
    """Whether `value` is of declared type `tp` (an int is a float; a bool is not an int)."""
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return (isinstance(value, numbers.Real) and not isinstance(value, bool)
                and math.isfinite(float(value)))
    if tp is str:
        return isinstance(value, str)
    if tp == INT_TUPLE:
        return isinstance(value, tuple) and all(has_type(v, int) for v in value)
    if tp == OPTIONAL_INT:
        return value is None or has_type(value, int)
    if dataclasses.is_dataclass(tp):
        return isinstance(value, tp)
    raise TypeError(f"no check for declared type {tp!r}")


def check_field_types(obj: Any, label: Callable[[str], str] | None = None) -> None:
    """UsageError naming the first field of dataclass `obj` whose value has the wrong type, as
    `label(field name)` (default "Class.field")."""
    for name, tp in field_types(type(obj)).items():
        value = getattr(obj, name)
        if not has_type(value, tp):
            said = label(name) if label else f"{type(obj).__name__}.{name}"
            raise UsageError(f"{said} expects {expected(tp)}, got {value!r}")

