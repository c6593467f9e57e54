"""The web dashboard: server-rendered pages over the same service layer as the REST API."""
