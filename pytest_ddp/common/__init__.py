"""Both sides of the process boundary: the wire protocol, the table of operations, the kernel's process controls.

Imports nothing else of pytest_ddp.
"""
