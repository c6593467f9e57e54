"""A recommendation in a managed service's own form: what the DBA pastes, not postgresql.conf.

A twin (a sandbox sized like the managed instance) is tuned; the result is applied by the
service's own tools, each with its own syntax and units:

* **rds** (RDS and Aurora): the JSON list ``aws rds modify-db-parameter-group
  --parameters file://FILE`` reads: ``{"ParameterName", "ParameterValue", "ApplyMethod"}``
  per parameter, at most 20 per request, ``immediate`` only for dynamic parameters and
  ``pending-reboot`` for static ones (the ModifyDBParameterGroup API reference). Values are
  numbers in the parameter's pg_settings unit (shared_buffers in 8kB pages, work_mem in kB,
  max_wal_size in MB, checkpoint_timeout in s), booleans 1/0 as RDS's parameter groups
  list them.
* **cloudsql**: one ``gcloud sql instances patch INSTANCE --database-flags=k=v,...`` line,
  values in the pg_settings unit, booleans on/off. That flag *replaces* every flag the
  instance has, so the comment above it says to add the instance's own.
* **azure**: one ``az postgres flexible-server parameter set --name K --value V`` line per
  parameter (pg_settings units, on/off), then ``az postgres flexible-server restart``
  when a static parameter changed.
* **cnpg**: CloudNativePG's ``spec.postgresql.parameters`` (a map of strings; PostgreSQL's
  own syntax with units, e.g. "256MB").
* **patroni**: Patroni's ``postgresql.parameters`` as ``patronictl edit-config`` takes it
  (the same values).

Left out everywhere, each named in a comment (or, for rds's plain JSON, by :func:`omitted`):
durability-unsafe knobs (fsync, full_page_writes, synchronous_commit off ...), which a
managed service runs with on, and knobs this catalogue does not describe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from optimizer.catalogue import CATALOGUE
from optimizer.knobs import Knob, KnobError, KnobValueError

Service = Literal["rds", "cloudsql", "azure", "cnpg", "patroni"]
SERVICES: tuple[Service, ...] = ("rds", "cloudsql", "azure", "cnpg", "patroni")
RDS_MAX_PARAMETERS = 20  # ModifyDBParameterGroup: "a maximum of 20 parameters" a request


class ManagedFormatError(ValueError):
    """The recommendation cannot be written in that form; the message says why."""


@dataclass(frozen=True)
class Setting:
    name: str
    native: str  # PostgreSQL's own syntax, units included: "256MB", "on", "0.9"
    base: str  # a number in pg_settings' unit (no unit), or the enum/bool word
    static: bool  # postmaster context: takes effect after a restart only
    boolean: bool


def _knob(name: str) -> Knob | None:
    spec = CATALOGUE.get(name)
    if spec is None:
        return None
    return Knob(
        name=spec.name,
        kind=spec.kind,
        unit=spec.unit,
        lower=-math.inf,
        upper=math.inf,
        default=spec.default,
        choices=spec.choices,
        context=spec.context,
        aliases=spec.aliases,
    )


def _number(v: float, integer: bool) -> str:
    if integer:
        return str(int(v))
    return f"{v:.15g}"


def setting(name: str, value: str) -> Setting:
    """One knob's value in both forms; ManagedFormatError when it is not a catalogue knob
    or the value does not parse."""
    knob = _knob(name)
    if knob is None:
        raise ManagedFormatError(f"{name} is not a knob knobtune describes")
    try:
        parsed = knob.parse(value)
        native = knob.format(parsed)
    except (KnobError, KnobValueError) as exc:
        raise ManagedFormatError(str(exc)) from None
    base = parsed if isinstance(parsed, str) else _number(parsed, knob.kind == "integer")
    return Setting(name, native, base, knob.needs_restart, knob.kind == "bool")


def select(changes: Sequence[tuple[str, str]]) -> tuple[list[Setting], list[str]]:
    """(settings to export, names left out with why) for ``(knob, recommended value)``."""
    out: list[Setting] = []
    left: list[str] = []
    for name, value in changes:
        spec = CATALOGUE.get(name)
        if spec is None:
            left.append(f"{name} (not a knob knobtune describes)")
            continue
        if spec.durability_unsafe:
            left.append(f"{name} (durability-unsafe: a managed service keeps it safe)")
            continue
        out.append(setting(name, value))
    return out, left


def _bool_rds(word: str) -> str:
    return "1" if word == "on" else "0"


def render_rds(settings: Sequence[Setting]) -> str:
    """The ``--parameters file://`` JSON of ``aws rds modify-db-parameter-group``."""
    if len(settings) > RDS_MAX_PARAMETERS:
        raise ManagedFormatError(
            f"{len(settings)} parameters: RDS takes at most {RDS_MAX_PARAMETERS} in one "
            "modify-db-parameter-group request; export another format, or apply in two steps"
        )
    doc = [
        {
            "ParameterName": s.name,
            "ParameterValue": _bool_rds(s.base) if s.boolean else s.base,
            "ApplyMethod": "pending-reboot" if s.static else "immediate",
        }
        for s in settings
    ]
    return json.dumps(doc, indent=2) + "\n"


def _comments(header: Sequence[str], left: Sequence[str]) -> list[str]:
    lines = [f"# {h}" for h in header]
    if left:
        lines.append("# left out: " + ", ".join(left))
    return lines


def render_cloudsql(
    settings: Sequence[Setting], *, header: Sequence[str] = (), left: Sequence[str] = ()
) -> str:
    """One ``gcloud sql instances patch`` line (a shell script)."""
    lines = ["#!/bin/sh", *_comments(header, left)]
    if not settings:
        lines.append("# nothing to change")
        return "\n".join(lines) + "\n"
    lines += [
        "# --database-flags REPLACES every flag the instance has: add the instance's current",
        '# flags (gcloud sql instances describe "$INSTANCE") to this list before running it.',
    ]
    restart = [s.name for s in settings if s.static]
    if restart:
        lines.append(f"# {', '.join(restart)}: Cloud SQL restarts the instance to apply them")
    flags = ",".join(f"{s.name}={s.base}" for s in settings)
    lines.append(
        'gcloud sql instances patch "${INSTANCE:?set INSTANCE to the Cloud SQL instance}" '
        f"--database-flags={flags}"
    )
    return "\n".join(lines) + "\n"


def render_azure(
    settings: Sequence[Setting], *, header: Sequence[str] = (), left: Sequence[str] = ()
) -> str:
    """``az postgres flexible-server parameter set`` lines (a shell script)."""
    where = (
        '--resource-group "${RESOURCE_GROUP:?set RESOURCE_GROUP}" '
        '--server-name "${SERVER:?set SERVER to the flexible server\'s name}"'
    )
    lines = ["#!/bin/sh", "set -e", *_comments(header, left)]
    if not settings:
        lines.append("# nothing to change")
    for s in settings:
        lines.append(
            f"az postgres flexible-server parameter set {where} --name {s.name} --value {s.base}"
        )
    restart = [s.name for s in settings if s.static]
    if restart:
        lines.append(f"# {', '.join(restart)} take effect after a restart:")
        lines.append(
            'az postgres flexible-server restart --resource-group "$RESOURCE_GROUP" '
            '--name "$SERVER"'
        )
    return "\n".join(lines) + "\n"


def _yaml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid double-quoted YAML scalar


def render_cnpg(
    settings: Sequence[Setting], *, header: Sequence[str] = (), left: Sequence[str] = ()
) -> str:
    """A CloudNativePG Cluster fragment: ``spec.postgresql.parameters``."""
    lines = [*_comments(header, left)]
    restart = [s.name for s in settings if s.static]
    if restart:
        lines.append(f"# {', '.join(restart)}: the operator restarts the instances to apply them")
    lines += ["apiVersion: postgresql.cnpg.io/v1", "kind: Cluster", "spec:", "  postgresql:"]
    lines += _yaml_parameters(settings, "    ")
    return "\n".join(lines) + "\n"


def render_patroni(
    settings: Sequence[Setting], *, header: Sequence[str] = (), left: Sequence[str] = ()
) -> str:
    """Patroni's dynamic configuration (``patronictl edit-config``): ``postgresql.parameters``."""
    lines = [*_comments(header, left)]
    restart = [s.name for s in settings if s.static]
    if restart:
        lines.append(
            f"# {', '.join(restart)}: pending restart; patronictl restart CLUSTER applies them"
        )
    lines.append("postgresql:")
    lines += _yaml_parameters(settings, "  ")
    return "\n".join(lines) + "\n"


def _yaml_parameters(settings: Sequence[Setting], indent: str) -> list[str]:
    """A ``parameters:`` mapping at ``indent`` (``{}`` when empty), values quoted."""
    if not settings:
        return [f"{indent}parameters: {{}}"]
    rows = [f"{indent}  {s.name}: {_yaml_str(s.native)}" for s in settings]
    return [f"{indent}parameters:", *rows]


def render(
    service: str,
    changes: Sequence[tuple[str, str]],
    *,
    header: Sequence[str] = (),
) -> str:
    """The changed knobs ``(name, recommended value)`` in ``service``'s form; ``header``
    lines become comments (none in rds's JSON, which has no comments)."""
    settings, left = select(changes)
    if service == "rds":
        return render_rds(settings)
    if service == "cloudsql":
        return render_cloudsql(settings, header=header, left=left)
    if service == "azure":
        return render_azure(settings, header=header, left=left)
    if service == "cnpg":
        return render_cnpg(settings, header=header, left=left)
    if service == "patroni":
        return render_patroni(settings, header=header, left=left)
    raise ManagedFormatError(f"no managed format {service!r}; the formats: {', '.join(SERVICES)}")


def omitted(changes: Sequence[tuple[str, str]]) -> list[str]:
    """What :func:`render` leaves out, with why (rds's JSON cannot say it)."""
    return select(changes)[1]
