"""From the ranks' reports and states to what the user reads: merged pytest reports, failure text,
sequences, timeline, the HTML picture.

Imports groups, diagnose, common.
"""
