"""Pure judgement, no processes and no I/O: the ranks' states, the watchdog's verdicts, their wording.

Imports only common (and the public faults module).
"""
