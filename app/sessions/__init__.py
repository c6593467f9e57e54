"""Sessions: tuning sessions, as a user sees them and at work.

As a user sees them: schemas.py (the request and response bodies: sessions, trials,
schedules, apply and rollback), service.py (create, get, list, cancel), export.py,
summary.py, stream_stats.py, apply.py, verdicts.py, schedules.py; plan.py adapts a
stored request to the optimizer (knob space, start config, DescentSettings, a run as a
Measurement). At work, under a lease (app/lease.py): runner.py is the session loop
(SessionRunner; RunEnv, the seam); trial.py runs one trial on a target; store.py writes
a session's rows; recovery.py brings a target back; crashes.py counts a runner's
crashes. trial.py and recovery.py serve comparisons too (app/compare imports them), so
they import nothing else of this package but plan.py.

Keep this ``__init__`` free of imports: app/sweeps/ read a SessionIn
from schemas.py, and importing it runs this file first (tests/test_layout.py counts that
edge).
"""
