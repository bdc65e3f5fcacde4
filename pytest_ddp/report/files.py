"""A failed test's report files in ``--ddp-report-dir``: ``<test>.json``, ``<test>.trace.json``,
``<test>.html`` and ``<test>.fr/`` (the renderers in :mod:`pytest_ddp.report.model`'s list)."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_ddp.groups.runner import StartFailure
from pytest_ddp.report import flight_recorder, picture, timeline
from pytest_ddp.report.failure import format_stack
from pytest_ddp.report.json_report import to_json
from pytest_ddp.report.model import Report
from pytest_ddp.report.writable import file_name, printable_data


def write(directory: str, report: Report | StartFailure) -> Path:
    """Every file of ``report`` (a test no rank ran has no Flight Recorder dumps); the JSON's path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    name = file_name(report.test_id)
    # As a reader gets it, every string in it one that UTF-8 can encode.
    data = printable_data(json.loads(json.dumps(to_json(report), default=str)))
    target = path / f"{name}.json"
    target.write_text(json.dumps(data, indent=2))
    (path / f"{name}.trace.json").write_text(timeline.trace_json(data))
    test_file = data["test"].split("::")[0]
    page = picture.page(data, lambda text: format_stack(text, test_file))
    (path / f"{name}.html").write_text(page, encoding="utf-8")
    if isinstance(report, Report):
        flight_recorder.write(directory, report.test_id, report.states, report.backend, report.timeout)
    return target
