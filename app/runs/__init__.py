"""Background work under a lease: tuning sessions and client sweeps, run by the scheduler.

``heartbeat`` keeps a lease alive (both kinds); ``trial`` executes one trial on a target;
``store`` is a session's metadata writes; ``recovery`` brings a target back; ``session``
is the session loop; ``sweep`` runs a client sweep. See docs/architecture.md.
"""
