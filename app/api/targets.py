"""/api/v1/targets: register, list, get, delete (or retire) the servers to tune."""

from __future__ import annotations

from typing import Literal

from fastapi import Query, Response

from app.api.deps import DB, AppSettings, Sched, api_router
from app.postgres.cgroups import PROFILES
from app.targets import service
from app.targets.schemas import ProfileOut, RestartMethodOut, TargetIn, TargetOut, TargetPatch

router = api_router("targets")


@router.post("/targets", status_code=201, response_model=TargetOut)
def create_target(body: TargetIn, db: DB, settings: AppSettings, response: Response) -> TargetOut:
    target = service.create_target(db, settings, body)
    response.headers["Location"] = f"/api/v1/targets/{target.id}"
    return service.target_out(db, target, settings)


@router.get("/targets", response_model=list[TargetOut])
def list_targets(db: DB, settings: AppSettings) -> list[TargetOut]:
    return [service.target_out(db, t, settings) for t in service.list_targets(db)]


@router.get("/targets/{target_id}", response_model=TargetOut)
def get_target(target_id: int, db: DB, settings: AppSettings) -> TargetOut:
    return service.target_out(db, service.get_target(db, target_id), settings)


@router.patch("/targets/{target_id}", response_model=TargetOut)
def patch_target(target_id: int, body: TargetPatch, db: DB, settings: AppSettings) -> TargetOut:
    """Select the target's restart method (one the operator configured), or clear it."""
    target = service.set_restart_method(db, settings, target_id, body.restart_method)
    return service.target_out(db, target, settings)


@router.get("/profiles", response_model=list[ProfileOut])
def list_profiles() -> list[ProfileOut]:
    """The named hardware profiles a sandbox may take (docs/profiles.md)."""
    return [
        ProfileOut(
            name=p.name,
            models=p.models,
            memory_bytes=p.limits.memory_bytes or 0,
            disk_iops=p.limits.disk_iops or 0,
            disk_mbps=p.limits.disk_mbps or 0,
            cpus=p.limits.cpus or 0,
        )
        for p in PROFILES.values()
    ]


@router.get("/restart-methods", response_model=list[RestartMethodOut])
def list_restart_methods(settings: AppSettings) -> list[RestartMethodOut]:
    """The restart methods configured on this service (KNOBTUNE_RESTART_METHODS), by name."""
    return [
        RestartMethodOut(name=name, kind=m.kind)
        for name, m in sorted(settings.restart_methods.items())
    ]


@router.delete("/targets/{target_id}", status_code=204)
def delete_target(
    target_id: int,
    db: DB,
    sched: Sched,
    history: Literal["keep", "drop"] | None = Query(
        default=None,
        description="For a target with sessions: 'keep' retires it (hidden from lists, its "
        "sessions and trials stay), 'drop' deletes them with it. Without it such a target "
        "gets 409.",
    ),
) -> Response:
    service.delete_target(db, target_id, history)
    if sched is not None:
        sched.sync_schedules()  # its schedules went with it
    return Response(status_code=204)
