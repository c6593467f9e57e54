"""The REST API (/api/v1): a router per domain (targets, sessions, schedules, sweeps, knobs)."""
