"""docs/faults.md's examples run as they are written: each ```python block that starts with
``# <file>.py: passes`` (or ``fails``) is a whole test file, run in an inner session on real
ranks; for a failing one, the report lines the page shows after it must be in the output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).parent.parent / "docs" / "faults.md"
# (code, file name, outcome, the ```text block that follows it before any other code block)
EXAMPLE = re.compile(
    r"```python\n(# (test_\w+)\.py: (passes|fails)\n.*?)```(?:\s*\n(?:[^`]*?)```text\n(.*?)```)?", re.S
)


def examples() -> list[tuple[str, str, str, str]]:
    return [(name, outcome, code, shown or "") for code, name, outcome, shown in EXAMPLE.findall(DOC.read_text())]


def test_the_page_has_an_example_that_survives_and_one_that_does_not():
    outcomes = {outcome for _, outcome, _, _ in examples()}
    assert outcomes == {"passes", "fails"}


@pytest.mark.parametrize(("name", "outcome", "code", "shown"), examples(), ids=[e[0] for e in examples()])
def test_example(pytester: pytest.Pytester, name: str, outcome: str, code: str, shown: str):
    pytester.makepyfile(**{name: code})
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    tests = len(re.findall(r"^def test_", code, re.M))
    if outcome == "passes":
        result.assert_outcomes(passed=tests)
        return
    result.assert_outcomes(failed=tests)
    output = result.stdout.str()
    for line in shown.splitlines():
        if line.startswith("injected:"):
            assert line in output
        elif line.startswith(("ddp:", "rank ")):  # shown cut at "[...]"
            assert line.split("[...]")[0] in output
