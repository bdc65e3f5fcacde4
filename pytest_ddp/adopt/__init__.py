"""Existing distributed test classes, run as they are on warm ranks (``--ddp-adopt``).

:mod:`pytest_ddp.adopt.collect` marks the items of torch's harness classes as ddp tests (in the
controller and in each rank, which collect alike); :mod:`pytest_ddp.adopt.torch_classes` runs them
in a rank as torch's spawned processes would run them.  docs/adopt.md says what is supported.
"""
