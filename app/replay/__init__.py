"""Replaying a captured workload (issue 28): the plan's encoding and the player.

``plan`` (stdlib only) encodes what a replay runs; ``player`` (stdlib and psycopg only,
run as ``python -m app.replay.player``) runs it and speaks pgbench's output formats, so
that app/postgres/pgbench.py drives and reads it like pgbench. Neither imports anything
heavy: the player starts once per benchmark run, as the unprivileged run-as user.
"""
