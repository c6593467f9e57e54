"""Request and response bodies of captures: a live capture's request, a capture as the API
shows it, and the rule for a capture's name."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# A capture's name: a letter first (an all-digit name would read as an id), then letters,
# digits, _ . - (no path characters, no spaces).
CAPTURE_NAME = r"^[A-Za-z][A-Za-z0-9_.\-]{0,99}$"
CAPTURE_NAME_RULE = "a letter, then letters, digits, _ . - (at most 100)"


class CaptureIn(BaseModel):
    """A live capture: the target's statements logged for a while (issue 28)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    target_id: int
    name: str = Field(
        min_length=1, max_length=100, pattern=CAPTURE_NAME, description=CAPTURE_NAME_RULE
    )
    seconds: int = Field(
        ge=10, le=7200, description="How long to log every statement, in seconds (10-7200)."
    )
    database: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="The database whose statements are kept (default: the target DSN's).",
    )


class CaptureOut(BaseModel):
    """A capture as the API shows it: never a statement, only normalized query texts."""

    id: int
    name: str
    source: str  # live, import
    target_id: int | None
    target_name: str | None = None
    database: str
    status: str
    phase: str
    seconds: int | None  # asked for (live captures)
    elapsed_s: float | None
    raw_bytes: int | None  # log text kept
    stored_bytes: int | None  # compressed and encrypted, on disk
    truncated: bool
    summary: dict[str, Any] | None
    summary_text: str  # the summary in plain words (what the CLI and the dashboard show)
    notes: list[Any]
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
