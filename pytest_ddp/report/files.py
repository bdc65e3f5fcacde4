"""A failed test's report files in ``--ddp-report-dir``: ``<test>.json``, ``<test>.trace.json``,
``<test>.html`` and ``<test>.fr/`` (the renderers in :mod:`pytest_ddp.report.model`'s list)."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_ddp.groups.runner import StartFailure
from pytest_ddp.report import flight_recorder, picture, timeline
from pytest_ddp.report.json_report import to_json
from pytest_ddp.report.model import Report
from pytest_ddp.report.writable import file_name, folder, printable_data, write_file


def write(directory: str, report: Report | StartFailure) -> Path:
    """Every file of ``report`` (a test no rank ran has no Flight Recorder dumps), each in place of
    any of its name, never through a link (:mod:`pytest_ddp.report.writable`); the JSON's path."""
    run = report.run if isinstance(report, Report) else report
    name = file_name(run.test_id)
    # As a reader gets it, every string in it one that UTF-8 can encode.
    data = printable_data(json.loads(json.dumps(to_json(report), default=str)))
    with folder(directory) as parent:
        write_file(parent, f"{name}.json", json.dumps(data, indent=2).encode())
        write_file(parent, f"{name}.trace.json", json.dumps(timeline.trace(data)).encode())
        write_file(parent, f"{name}.html", picture.page(data).encode())
    if isinstance(report, Report):
        flight_recorder.write(directory, run.test_id, report.run.states, run.spec.backend, run.spec.timeout)
    return Path(directory) / f"{name}.json"
