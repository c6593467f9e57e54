"""Background jobs: the scheduler that claims sessions and sweeps and fires schedules."""
