"""knobtune service: FastAPI app, metadata DB, scheduler and adapters to PostgreSQL."""
