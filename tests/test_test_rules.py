"""Rules the tests themselves keep (tests that can fail for the right reasons).

A `return` inside a hypothesis property ends the example as a pass: a case the property
skips that way is counted as checked. Cases a property cannot check are discarded with
`assume` (hypothesis counts them apart, and fails a property that discards too many). The one
`return` allowed is right after the property checked the case's error path (a
`with pytest.raises(...)` block, or an `assert` in an except clause).
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_given(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "given") or \
        (isinstance(target, ast.Attribute) and target.attr == "given")


def _checks_an_error(statement: ast.stmt) -> bool:
    """`with pytest.raises(...)` or `assert ...`: the case was checked before the return."""
    if isinstance(statement, ast.Assert):
        return True
    return isinstance(statement, ast.With) and any(
        isinstance(item.context_expr, ast.Call) and isinstance(item.context_expr.func, ast.Attribute)
        and item.context_expr.func.attr == "raises" for item in statement.items)


def silent_returns(source: str) -> list[str]:
    """'function:line' of every `return` in a @given function (not in a nested def) whose
    preceding statement in its block did not check an error path."""
    found = []

    def visit_block(function: str, body: list[ast.stmt]) -> None:
        for i, statement in enumerate(body):
            if isinstance(statement, ast.Return) and not (i and _checks_an_error(body[i - 1])):
                found.append(f"{function}:{statement.lineno}")
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody"):
                visit_block(function, getattr(statement, field, []) or [])
            for handler in getattr(statement, "handlers", []):
                visit_block(function, handler.body)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(_is_given(d) for d in node.decorator_list):
            visit_block(node.name, node.body)
    return found


def test_no_hypothesis_property_passes_a_case_by_returning():
    offenders = {path.name: found for path in sorted(TESTS.glob("*.py"))
                 if (found := silent_returns(path.read_text()))}
    assert not offenders, f"use hypothesis.assume, not return, to skip a case: {offenders}"


def test_the_rule_finds_a_planted_silent_return_and_allows_a_checked_one():
    planted = '''
@given(st.integers())
def test_a(x):
    if x < 0:
        return
    assert x >= 0

@settings(max_examples=5)
@given(st.integers())
def test_b(x):
    if x < 0:
        with pytest.raises(ValueError):
            f(x)
        return
    try:
        g(x)
    except ValueError as e:
        assert x > 9, e
        return
    def helper():
        return 1
'''
    assert silent_returns(planted) == ["test_a:5"]


TIMING_BOUNDS = (r"mark\.solo", r"perf_counter\(\).*assert", r"assert .*(speedup|step_s|_seconds) *[<>]")


def timing_bounds(source: str) -> list[int]:
    """Lines of `source` that look like a test judging a measured time (a bound on a time or a
    speed-up, a test that must run alone): timings are reported by benchmarks, never asserted."""
    import re

    return [n for n, line in enumerate(source.splitlines(), 1) if any(re.search(p, line) for p in TIMING_BOUNDS)]


def test_no_test_bounds_a_measured_time():
    offenders = {path.name: found for path in sorted(TESTS.glob("*.py"))
                 if path.name != Path(__file__).name and (found := timing_bounds(path.read_text()))}
    assert not offenders, f"a test judges a measured time; move it to a benchmark: {offenders}"


def test_the_timing_rule_finds_planted_bounds():
    # written in pieces, so this file itself holds no line the rule (and the house check) flags
    planted = "@pytest.mark." + "solo\ndef f():\n    assert speed" + "up > 1.5\n    assert r.step" + "_s < 0.2\n"
    assert timing_bounds(planted) == [1, 3, 4]
    assert timing_bounds("assert row['speedup'] == pytest.approx(2.0)\nassert x > 0\n") == []
