"""Both sides of the process boundary: the wire protocol, the table of operations, the kernel's
process controls and /proc, the handshake that proves a connection's other end.  Imports nothing
else of pytest_ddp.
"""
