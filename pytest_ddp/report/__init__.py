"""From the ranks' reports and states to what the user reads: pytest's reports merged per phase
(merge.py), and a failed test's report built once as data (model.py) and rendered per format: the
failure text (failure.py), the JSON (json_report.py), its Chrome trace and HTML page (timeline.py,
picture.py), torch's Flight Recorder dumps (flight_recorder.py), written by files.py.

Imports groups, diagnose, common.
"""
