"""One case of the field corpus: a public report reduced to a ddp test, its fixed twin, and the
verdict a report should give on it (issue 44)."""

from __future__ import annotations

from dataclasses import dataclass

# The comment that marks, in a case's body, the line a verdict should point the user to: the
# culprit's own call or raise, or the call its peers wait in that the culprit skipped.
MARK = "# <- culprit line"


@dataclass(frozen=True)
class Case:
    name: str  # unique across the corpus; the test is test_<name>, its twin test_<name>_twin
    url: str  # the public report (a GitHub issue or PR), as the search returned it
    summary: str  # what the reporter hit, in one line
    world_size: int
    body: str  # the test's body, written the way the reporter's code was; one line carries MARK
    twin: str  # the same test after the fix the thread found: it must pass
    kind: str  # the verdict's kind (pytest_ddp.diagnose.verdicts): init, partial, mismatch, ...
    culprits: tuple[int, ...]  # the ranks at fault
    op: str | None  # the operation at fault, where there is one
    outcome: str = "failed"
    init: bool = True  # False: the body calls init_process_group itself
    held_out: bool = False  # kept for the closing note: not looked at when rules are written
