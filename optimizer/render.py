"""Render a recommendation as a postgresql.conf fragment, an ALTER SYSTEM script, or JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from optimizer.catalogue import CATALOGUE
from optimizer.knobs import Config

_PLAIN_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_PLAIN_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")
_SINGLE_LINE = re.compile(r"[\r\n]+")
UNSAFE_WARNING = (
    "WARNING: DURABILITY-UNSAFE: {name} = {value} trades crash safety for speed; "
    "a crash or power loss can lose committed transactions or corrupt data. "
    "Use it only where the data can be rebuilt."
)


@dataclass(frozen=True)
class KnobNote:
    """What happened to one knob during the session."""

    name: str
    original: str
    recommended: str
    gain: float | None = None  # measured gain of the kept steps on this knob (None: unchanged)
    trials: int = 0  # benchmark runs spent evaluating this knob
    needs_restart: bool = False
    durability_unsafe: bool = False
    excluded: str | None = None  # why the knob was dropped, if it was
    # set aside: the runs span no checkpoint cycle, so they could not show this knob
    # (optimizer/checkpoints.py); the note names the run length it needs. Not "no effect".
    not_judged: str | None = None
    # kept as part of several knobs changed at once (the hints): that candidate's gain
    together: float | None = None

    @property
    def changed(self) -> bool:
        return self.original != self.recommended


@dataclass(frozen=True)
class Recommendation:
    """Original and recommended configs with the evidence per knob.

    ``header`` is free-form context for the reader (target, workload, date, ...): the
    optimizer has no clock and no I/O, so the caller supplies it.
    """

    original: Config
    recommended: Config
    notes: tuple[KnobNote, ...] = ()
    overall_gain: float | None = None
    overall_p_value: float | None = None
    objective: str = "throughput"
    trials: int = 0
    header: Mapping[str, str] = field(default_factory=dict)
    # how sure overall_gain is: confirmed (a final check measured it), not-credible (it
    # measured min_gain or more, but not credibly), unconfirmed (the
    # check did not complete), no-change (the check found nothing worth recommending),
    # none (nothing was kept); None: not known (an old session)
    gain_status: str | None = None
    overall_ci: tuple[float, float] | None = None  # 95% interval of overall_gain
    check: str | None = None  # what the final check was, e.g. "3 + 3 side-by-side runs"

    @classmethod
    def from_trials(
        cls,
        *,
        original: Mapping[str, str],
        recommended: Mapping[str, str],
        trials: Iterable[tuple[str | Sequence[str] | None, str | None, float | None]] = (),
        overall_gain: float | None = None,
        overall_p_value: float | None = None,
        header: Mapping[str, object] | None = None,
        unsafe: Iterable[str] = (),
        objective: str = "throughput",
        gain_status: str | None = None,
        overall_ci: tuple[float, float] | None = None,
        check: str | None = None,
        not_judged: Mapping[str, str] | None = None,
    ) -> Recommendation:
        """Build from stored trials: (knob(s) or None, "keep"/"revert"/None, gain or None) each.

        A trial that changed several knobs at once (the PGTune-style hints) names them all:
        each counts as tried. Per knob: trials = candidate runs that changed it, gain = the
        kept gains of its own trials compounded.
        """
        rows = [((k,) if isinstance(k, str) else tuple(k or ()), v, g) for k, v, g in trials]
        unsafe_set = set(unsafe)
        notes = []
        for name in dict.fromkeys([*original, *recommended]):
            mine = [(v, g if len(ks) == 1 else None) for ks, v, g in rows if name in ks]
            kept = [g for v, g in mine if v == "keep" and g is not None]
            joint = [g for ks, v, g in rows if name in ks and len(ks) > 1 and v == "keep"]
            gain = None
            if kept:
                total = 1.0
                for g in kept:
                    total *= 1 + g
                gain = total - 1
            spec = CATALOGUE.get(name)
            orig = original.get(name, "")
            notes.append(
                KnobNote(
                    name=name,
                    original=orig,
                    recommended=recommended.get(name, orig),
                    gain=gain,
                    trials=len(mine),
                    needs_restart=spec is not None and spec.context == "postmaster",
                    durability_unsafe=name in unsafe_set
                    or (spec is not None and spec.durability_unsafe),
                    together=joint[-1] if joint else None,
                    not_judged=(not_judged or {}).get(name),
                )
            )
        return cls(
            original=dict(original),
            recommended=dict(recommended),
            notes=tuple(notes),
            overall_gain=overall_gain,
            overall_p_value=overall_p_value,
            objective=objective,
            trials=len(rows),
            header={str(k): str(v) for k, v in (header or {}).items()},
            gain_status=gain_status,
            overall_ci=overall_ci,
            check=check,
        )

    def changed(self) -> list[KnobNote]:
        return [n for n in self.all_notes() if n.changed]

    def all_notes(self) -> tuple[KnobNote, ...]:
        """Per-knob notes; derived from the two configs when none were given."""
        if self.notes:
            return self.notes
        names = list(dict.fromkeys([*self.original, *self.recommended]))
        notes = []
        for n in names:
            spec = CATALOGUE.get(n)
            orig = self.original.get(n, "")
            notes.append(
                KnobNote(
                    n,
                    orig,
                    self.recommended.get(n, orig),
                    needs_restart=spec is not None and spec.context == "postmaster",
                    durability_unsafe=spec is not None and spec.durability_unsafe,
                )
            )
        return tuple(notes)

    def warnings(self) -> list[str]:
        return [
            UNSAFE_WARNING.format(name=n.name, value=n.recommended)
            for n in self.all_notes()
            if n.durability_unsafe and n.changed
        ]


def _oneline(text: str) -> str:
    return _SINGLE_LINE.sub(" ", text)


def quote_literal(value: str) -> str:
    """A SQL / postgresql.conf string literal: single quotes, embedded quotes doubled."""
    if "\x00" in value:
        raise ValueError("a setting value cannot contain a NUL byte")
    return "'" + value.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted only when it is not a plain lower-case name."""
    if _PLAIN_IDENT.match(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _conf_value(value: str) -> str:
    return value if _PLAIN_NUMBER.match(value) else quote_literal(value)


def _evidence(n: KnobNote) -> str:
    if n.gain is not None:
        gain = f"{n.gain:+.1%} measured"
    elif n.together is not None:
        gain = f"{n.together:+.1%} measured together with the other hinted knobs"
    else:
        gain = "no measured gain"
    restart = ", needs restart" if n.needs_restart else ""
    return f"{n.original} -> {n.recommended} ({gain}, {n.trials} trials{restart})"


STATUS_LABELS = {
    "confirmed": "confirmed by the final check",
    "not-credible": "not credible",
    "unconfirmed": "UNCONFIRMED",
    "no-change": "no change recommended",
}


def status_label(status: str | None) -> str:
    """How sure a claimed gain is, in a few words for a list or a card ('' if nothing to say)."""
    return STATUS_LABELS.get(status or "", "")


def claim_text(rec: Recommendation) -> str | None:
    """The session's claimed gain in one line, saying how sure it is (None: nothing to say)."""
    g, status = rec.overall_gain, rec.gain_status
    if status == "none":
        return "no credible gain found: the original config stays as it is"
    if status == "no-change":
        return (
            "no change recommended: the final check did not show the walk's best worth it "
            "(less than min_gain better, or not credible while the load moved; see the notes)"
        )
    if g is None:
        return None
    ci = f"95% CI {rec.overall_ci[0]:+.1%}..{rec.overall_ci[1]:+.1%}, " if rec.overall_ci else ""
    p = f"p={rec.overall_p_value:.2g}" if rec.overall_p_value is not None else "p=n/a"
    if status == "confirmed":
        how = f"; confirmed by the final check ({rec.check})" if rec.check else ""
        return f"overall measured gain vs original: {g:+.1%} ({ci}{p}{how})"
    if status == "not-credible":
        how = f" ({rec.check})" if rec.check else ""
        return (
            f"overall measured gain vs original: {g:+.1%} ({ci}{p}): measured by the final "
            f"check{how} but NOT CREDIBLE at the verdict's error rate; it may be noise"
        )
    if status == "unconfirmed":
        return (
            f"overall gain vs original: {g:+.1%} UNCONFIRMED ({ci}{p}): the final check "
            "did not complete, so this compares runs minutes apart and may be load drift"
        )
    return f"overall measured gain vs original: {g:+.1%} ({ci}{p})"


def _header_lines(rec: Recommendation, prefix: str) -> list[str]:
    lines = [f"{prefix} knobtune recommendation ({rec.objective}, {rec.trials} trials)"]
    for k, v in rec.header.items():
        lines.append(f"{prefix} {_oneline(k)}: {_oneline(v)}")
    claim = claim_text(rec)
    if claim is not None:
        lines.append(f"{prefix} {claim}")
    for w in rec.warnings():
        lines.append(f"{prefix} {'!' * 70}")
        lines.append(f"{prefix} {w}")
        lines.append(f"{prefix} {'!' * 70}")
    return lines


def render_conf(rec: Recommendation) -> str:
    """A postgresql.conf fragment: changed knobs only, each with its evidence as a comment."""
    lines = _header_lines(rec, "#")
    changed = rec.changed()
    for n in changed:
        lines.append("")
        if n.durability_unsafe:
            lines.append(f"# {UNSAFE_WARNING.format(name=n.name, value=n.recommended)}")
        lines.append(f"# {n.name}: {_evidence(n)}")
        lines.append(f"{n.name} = {_conf_value(n.recommended)}")
    same = [n for n in rec.all_notes() if not n.changed]
    groups = (
        ("unchanged (no credible gain)", [n.name for n in same if n.trials and not n.excluded]),
        (
            "not tried (budget spent first)",
            [n.name for n in same if not n.trials and not n.excluded and not n.not_judged],
        ),
        ("excluded", [f"{n.name} ({_oneline(n.excluded)})" for n in same if n.excluded]),
        ("unchanged, set aside", [_oneline(n.not_judged) for n in same if n.not_judged]),
    )
    if rec.notes and any(n.trials for n in rec.notes):
        for label, names in groups:
            if names:
                lines.append("")
                lines.append(f"# {label}: {', '.join(names)}")
    elif same:
        lines.append("")
        lines.append(f"# unchanged: {', '.join(n.name for n in same)}")
    return "\n".join(lines) + "\n"


def render_sql(rec: Recommendation) -> str:
    """An ALTER SYSTEM script with properly quoted literals, then a reload."""
    lines = _header_lines(rec, "--")
    changed = rec.changed()
    for n in changed:
        if n.durability_unsafe:
            lines.append(f"-- {UNSAFE_WARNING.format(name=n.name, value=n.recommended)}")
        lines.append(f"-- {n.name}: {_evidence(n)}")
        lines.append(f"ALTER SYSTEM SET {quote_ident(n.name)} = {quote_literal(n.recommended)};")
    if changed:
        lines.append("SELECT pg_reload_conf();")
        restart = [n.name for n in changed if n.needs_restart]
        if restart:
            lines.append(f"-- restart the server for {', '.join(restart)} to take effect")
    return "\n".join(lines) + "\n"


def render_json(rec: Recommendation) -> str:
    """The recommendation as JSON (warnings in a top-level "warnings" list)."""
    doc = {
        "objective": rec.objective,
        "trials": rec.trials,
        "header": dict(rec.header),
        "overall_gain": rec.overall_gain,
        "overall_p_value": rec.overall_p_value,
        "overall_ci": list(rec.overall_ci) if rec.overall_ci else None,
        "gain_status": rec.gain_status,
        "claim": claim_text(rec),
        "original": dict(rec.original),
        "recommended": dict(rec.recommended),
        "knobs": [
            {
                "name": n.name,
                "original": n.original,
                "recommended": n.recommended,
                "changed": n.changed,
                "gain": n.gain,
                "trials": n.trials,
                "needs_restart": n.needs_restart,
                "durability_unsafe": n.durability_unsafe,
                "excluded": n.excluded,
                "not_judged": n.not_judged,
            }
            for n in rec.all_notes()
        ],
        "warnings": rec.warnings(),
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"
