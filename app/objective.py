"""A request's objective: the one place that reads it (issue 43).

A session's request (SessionIn, or its stored JSON) names the objective's kind, the
stream to judge and the streams' weights and p95 limits; a comparison's names the kind
only. The optimizer's Objective is built here for the descent, the comparison's runs and
the charts' levels alike; the kinds' vocabulary is optimizer/objective.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import BaseModel

from optimizer.evidence import Objective
from optimizer.objective import ObjectiveKind, objective_kind

# the request's fields that make its Objective (a comparison's request has the first only)
_FIELDS = ("objective", "objective_stream", "stream_weights", "p95_limits")


def objective_of(request: BaseModel | Mapping[str, Any]) -> Objective:
    """The request's objective, and how several streams combine into it."""
    if isinstance(request, BaseModel):
        request = {f: getattr(request, f) for f in _FIELDS if hasattr(request, f)}
    return Objective(
        kind=cast(ObjectiveKind, objective_kind(request)),  # Objective checks the kind
        primary=request.get("objective_stream"),
        weights=dict(request.get("stream_weights") or {}),
        p95_limits=dict(request.get("p95_limits") or {}),
    )
