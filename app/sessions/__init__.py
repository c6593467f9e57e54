"""Sessions: tuning sessions as a user sees them (requests, progress, exports, schedules)."""
