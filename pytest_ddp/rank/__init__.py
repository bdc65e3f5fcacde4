"""A rank process: its entry point, its link to the controller, its pytest session, what a test
left behind, the MPI stand-in.

Imports record, common and faults; never diagnose, report, groups or config.
"""
