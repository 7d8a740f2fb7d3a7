"""The torture suite's machinery: crash trials, disk faults, load; shared with the tests.

``benchmarks/torture.py`` runs it and prints the figures; ``tests/test_torture_*.py`` run a
few bounded trials of each kind to keep the correctness claims tested in CI.
"""
