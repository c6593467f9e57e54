"""The home page's target forms: register a target (or a sandbox), remove one."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import DB, AppSettings, Sched
from app.postgres.sandbox import SandboxError
from app.targets import service as target_svc
from app.targets.schemas import TargetIn
from app.web.index import index_page
from app.web.render import Form, page_routers, shown_on

page, post = page_routers()


def _sandbox_profile(form: dict[str, str]) -> dict[str, Any] | None:
    """The form's hardware profile of a new sandbox (a name and/or limits), or None."""
    out: dict[str, Any] = {}
    if name := form.get("profile", "").strip():
        out["profile"] = name
    if memory := form.get("sandbox_memory", "").strip():
        out["memory"] = memory
    for key, field in (("sandbox_iops", "disk_iops"), ("sandbox_mbps", "disk_mbps")):
        if value := form.get(key, "").strip():
            try:
                out[field] = int(value)
            except ValueError:
                raise ValueError(f"{field}: a whole number, not {value[:20]!r}") from None
    if value := form.get("sandbox_cpus", "").strip():
        try:
            out["cpus"] = int(value)
        except ValueError:
            raise ValueError(f"sandbox CPUs: a whole number, not {value[:20]!r}") from None
    if out and form.get("sandbox") != "on":
        raise ValueError(
            "a hardware profile is for a sandbox: tick Sandbox, or clear the profile fields"
        )
    return out or None


@post.post("/targets")
def register_target(request: Request, db: DB, settings: AppSettings, form: Form) -> Response:
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "sandbox": form.get("sandbox") == "on",
        "recommend_only": form.get("recommend_only") == "on",
    }
    for key in ("dsn", "restart_method", "data_dir", "cpus"):
        if value := form.get(key, "").strip():
            body[key] = value

    def again(message: str, _status: int = 422) -> Response:
        # the target form answers 422 whatever the refusal
        return index_page(request, db, target_form=form, target_error=message, status=422)

    try:
        if ram := form.get("ram_gib", "").strip():
            body["ram_bytes"] = int(float(ram) * 2**30)
    except ValueError:
        return again("RAM: give the target's memory in GiB, e.g. 16")
    try:
        profile = _sandbox_profile(form)
    except ValueError as exc:
        return again(str(exc))
    if profile:
        body["sandbox"] = profile
    with shown_on(again, form=True):
        try:
            target = target_svc.create_target(db, settings, TargetIn.model_validate(body))
        except SandboxError as exc:  # not mapped by target_svc.create_target (yet): never a 500
            return again(f"could not create the sandbox: {exc}")
    return RedirectResponse(f"/?target_id={target.id}#new-session", status_code=303)


@post.post("/targets/{target_id}/delete")
def delete_target(target_id: int, request: Request, db: DB, sched: Sched, form: Form) -> Response:
    """The dashboard's remove buttons: keep the target's history (retire) or drop it."""
    choice = form.get("history")
    history: target_svc.HistoryChoice | None = (
        "keep" if choice == "keep" else "drop" if choice == "drop" else None
    )
    with shown_on(
        lambda message, status: index_page(request, db, target_error=message, status=status)
    ):
        target_svc.delete_target(db, target_id, history)
    if sched is not None:
        sched.sync_schedules()
    return RedirectResponse("/#targets", status_code=303)
