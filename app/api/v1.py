"""/api/v1: one router per domain, thin over the domain services, behind the token guard."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import captures, compare, knobs, schedules, sessions, sweeps, targets

ROUTERS: tuple[APIRouter, ...] = tuple(
    d.router for d in (targets, sessions, knobs, schedules, sweeps, captures, compare)
)
