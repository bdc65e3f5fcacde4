"""Settings resolved once, the marker's spec, what this machine holds.

Imports only common (and the public faults module).
"""
