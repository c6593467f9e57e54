"""Comparisons (issue 42): `knobtune compare`, interleaved rounds of named configs on a
target, each one's level and gain over a reference, the target restored."""
