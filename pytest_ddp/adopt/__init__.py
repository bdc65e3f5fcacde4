"""Existing distributed test classes, run as they are on warm ranks (``--ddp-adopt``).
docs/adopt.md says what is supported.
"""
