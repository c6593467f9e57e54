"""Reports: what a session or a sweep found, drawn for people (chart.py: SVG charts for the
CLI and the dashboard). Above the domains whose results they draw, beside the edges."""
