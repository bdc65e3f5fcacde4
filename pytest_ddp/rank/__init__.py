"""A rank process: its entry point, its link to the controller, its pytest session, what a test
left behind, the MPI stand-in.  Layer rules: tests/test_layers.py.
"""
