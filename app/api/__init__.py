"""REST API routers, mounted under /api/v1."""
