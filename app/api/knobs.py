"""/api/v1/knobs: the knob catalogue."""

from __future__ import annotations

from app.api.deps import api_router
from optimizer.catalogue import CATALOGUE

router = api_router("knobs")


@router.get("/knobs")
def list_knobs() -> list[dict[str, object]]:
    return [spec.describe() for spec in CATALOGUE.values()]
