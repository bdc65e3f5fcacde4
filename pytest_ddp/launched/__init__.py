"""Launched mode: a pytest started by torchrun, srun or mpiexec, one per rank, rank 0's the controller.

Imports groups, config, common.
"""
