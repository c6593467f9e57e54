"""Captured workloads (issue 28): a server's statements, logged for a while or imported.

logparse.py reads a log (PostgreSQL's own parser labels the statements); store.py keeps a
capture's log at rest (compressed, encrypted); service.py creates, lists, cancels and
deletes captures and imports logs (schemas.py: their request and response bodies);
summary.py says what a capture holds. A live capture runs as background work under a
lease (app/captures/runner.py).

Keep this ``__init__`` free of imports: app/workloads/replay.py imports ``logparse``, and
importing it runs this file first (tests/test_layout.py counts that edge).
"""
