"""Client sweeps (issue 16): the workload at increasing client counts, to find the knee."""
