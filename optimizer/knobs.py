"""Knob model shared by the optimizer and the adapters that read a real server.

Values are parsed and formatted exactly the way PostgreSQL 15's GUC code does
(``guc.c``: ``parse_int``, ``parse_real``, ``convert_to_base_unit``,
``parse_bool_with_len``, ``parse_enum``), so a string this module accepts is a
string ``ALTER SYSTEM SET`` accepts, and vice versa.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Literal

Config = dict[str, str]
"""Knob name -> value in PostgreSQL syntax, e.g. ``{"work_mem": "16MB", "jit": "off"}``."""

Kind = Literal["integer", "real", "enum", "bool"]
StepRule = Literal["multiplicative", "additive", "ordered"]


class KnobValueError(ValueError):
    """A value PostgreSQL would not accept for this knob (message names knob and accepted forms)."""


class KnobError(ValueError):
    """A knob-space problem (unknown or unsafe knob, empty bounds); says what to change."""


@dataclass(frozen=True)
class SettingRow:
    """One row of PostgreSQL's ``pg_settings`` view, as text, like the view gives it.

    The adapters in ``app`` build these from a live server; the optimizer uses
    them to narrow a knob's bounds to what that server accepts.
    """

    name: str
    setting: str
    unit: str | None
    vartype: str  # bool, enum, integer, real, string
    context: str  # postmaster, sighup, superuser, user, ...
    min_val: str | None = None
    max_val: str | None = None
    enumvals: tuple[str, ...] | None = None
    reset_val: str | None = None
    boot_val: str | None = None
    pending_restart: bool = False


# --- units ------------------------------------------------------------------------------------

# Unit spellings PostgreSQL accepts, largest first (order matters: after a conversion PG rounds
# to a multiple of the *next smaller* unit of the same family, see convert_to_base_unit).
_MEMORY_UNITS: tuple[tuple[str, float], ...] = (
    ("TB", 1024.0**4),
    ("GB", 1024.0**3),
    ("MB", 1024.0**2),
    ("kB", 1024.0),
    ("B", 1.0),
)  # size in bytes
_TIME_UNITS: tuple[tuple[str, float], ...] = (
    ("d", 86_400_000.0),
    ("h", 3_600_000.0),
    ("min", 60_000.0),
    ("s", 1000.0),
    ("ms", 1.0),
    ("us", 0.001),
)  # length in milliseconds
_MAX_UNIT_LEN = 3  # guc.c MAX_UNIT_LEN: longer unit tokens are rejected
_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the C locale; str.isspace() would accept Unicode too
_BLOCK_UNIT = re.compile(r"^(\d+)(B|kB|MB|GB|TB)$")


def unit_family(unit: str | None) -> tuple[str, float] | None:
    """('memory', bytes) or ('time', ms) for a pg_settings base unit like '8kB', 'MB' or 's'."""
    if unit is None or unit == "":
        return None
    for name, size in _MEMORY_UNITS:
        if unit == name:
            return ("memory", size)
    m = _BLOCK_UNIT.match(unit)  # '8kB', '16kB' (block-sized units such as shared_buffers')
    if m:
        return ("memory", int(m.group(1)) * dict(_MEMORY_UNITS)[m.group(2)])
    for name, size in _TIME_UNITS:
        if unit == name:
            return ("time", size)
    raise KnobError(f"unsupported PostgreSQL unit {unit!r}")


def convert_unit(value: float, from_unit: str | None, to_unit: str | None) -> float:
    """Convert a number between two base units of the same family (e.g. '8kB' pages -> 'kB')."""
    a, b = unit_family(from_unit), unit_family(to_unit)
    if a is None and b is None:
        return value
    if a is None or b is None or a[0] != b[0]:
        raise KnobError(f"cannot convert between units {from_unit!r} and {to_unit!r}")
    return value * a[1] / b[1]


# --- C number parsing (strtol base 0 / strtod) ------------------------------------------------

_STRTOL = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_STRTOD = re.compile(
    r"[ \t\n\v\f\r]*(?P<num>[+-]?(?:"
    r"0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
    r"|[nN][aA][nN](?:\([0-9A-Za-z_]*\))?"
    r"))"
)
_LONG_MAX = 2**63 - 1


def _strtol(text: str) -> tuple[int, int, bool] | None:
    """Like C ``strtol(text, &end, 0)``: (value, end offset, overflowed) or None if no digits."""
    m = _STRTOL.match(text)
    if m is None:
        return None
    digits = m.group(2)
    if digits[:2] in ("0x", "0X"):
        v = int(digits[2:], 16)
    elif len(digits) > 1 and digits[0] == "0":
        v = int(digits, 8)  # C treats a leading 0 as octal, so '010' is 8, as in PostgreSQL
    else:
        v = int(digits)
    if m.group(1) == "-":
        v = -v
    return v, m.end(), not (-_LONG_MAX - 1 <= v <= _LONG_MAX)


def _strtod(text: str) -> tuple[float, int, bool] | None:
    """Like C ``strtod``: (value, end offset, ERANGE) or None if nothing was parsed."""
    m = _STRTOD.match(text)
    if m is None:
        return None
    s = m.group("num")
    body = s.lstrip("+-")
    neg = s.startswith("-")
    if body[:2] in ("0x", "0X"):
        hexpart = body if re.search(r"[pP]", body) else body + "p0"
        try:
            v = float.fromhex(hexpart)
        except OverflowError:
            return (-math.inf if neg else math.inf), m.end(), True
        nonzero = re.search(r"[1-9a-fA-F]", body[2:].split("p")[0].split("P")[0]) is not None
    elif body[:1] in "iInN":
        v = math.inf if body[:1] in "iI" else math.nan
        nonzero = True
    else:
        v = float(body)
        nonzero = re.search(r"[1-9]", body.split("e")[0].split("E")[0]) is not None
    if neg:
        v = -v
    erange = (math.isinf(v) and body[:1] not in "iI") or (
        nonzero and v != 0 and abs(v) < 2.2250738585072014e-308
    )
    if nonzero and v == 0:
        erange = True  # underflow: glibc reports ERANGE
    return v, m.end(), erange


def _convert_unit_suffix(value: float, rest: str, unit: str) -> float | None:
    """``convert_to_base_unit``: apply the unit suffix ``rest``; None if it is invalid."""
    fam = unit_family(unit)
    assert fam is not None
    token = ""
    i = 0
    while i < len(rest) and rest[i] not in _C_SPACE and len(token) < _MAX_UNIT_LEN:
        token += rest[i]
        i += 1
    if rest[i:].strip(_C_SPACE) != "":
        return None  # unit too long, or garbage after it
    table = _MEMORY_UNITS if fam[0] == "memory" else _TIME_UNITS
    base = fam[1]
    for k, (name, size) in enumerate(table):
        if token != name:
            continue
        cvalue = value * size / base
        if k + 1 < len(table):  # round to a multiple of the next smaller unit, like PostgreSQL
            nxt = table[k + 1][1] / base
            cvalue = _rint(cvalue / nxt) * nxt
        return cvalue
    return None


def _rint(x: float) -> float:
    """C ``rint`` in the default rounding mode: round half to even (Python's round does that)."""
    if math.isinf(x) or math.isnan(x):
        return x
    return float(round(x))


def parse_bool(text: str) -> bool | None:
    """PostgreSQL ``parse_bool_with_len``: on/off/true/false/yes/no/1/0 and unique prefixes."""
    n = len(text)
    if n == 0:
        return None
    low = text.lower()
    c = low[0]
    if c == "t" and "true".startswith(low):
        return True
    if c == "f" and "false".startswith(low):
        return False
    if c == "y" and "yes".startswith(low):
        return True
    if c == "n" and "no".startswith(low):
        return False
    if c == "o" and n >= 2:  # 'o' alone is ambiguous between on and off
        if "on".startswith(low):
            return True
        if "off".startswith(low):
            return False
        return None
    if text == "1":
        return True
    if text == "0":
        return False
    return None


# --- the knob ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """One tunable PostgreSQL setting with the search's bounds and step rule.

    ``lower``/``upper`` are numeric in the base ``unit`` (as in pg_settings); for enums and bools
    they are indexes into ``choices`` and otherwise unused. ``floor`` is the first positive value
    a multiplicative walk uses when it starts from 0 ("off") or from a sentinel below ``lower``
    such as wal_buffers' -1 ("auto"): x2 from 0 would never move.
    """

    name: str
    kind: Kind
    unit: str | None
    lower: float
    upper: float
    default: str
    choices: tuple[str, ...] = ()
    context: str = "user"
    step: StepRule = "multiplicative"
    step_size: float = 2.0
    durability_unsafe: bool = False
    description: str = ""
    floor: float = 1.0
    aliases: tuple[tuple[str, str], ...] = ()  # extra enum spellings, e.g. ("on", "pglz")
    _family: tuple[str, float] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind in ("enum", "bool"):
            if self.kind == "bool" and not self.choices:
                object.__setattr__(self, "choices", ("off", "on"))
            if not self.choices:
                raise KnobError(f"{self.name}: an enum knob needs choices")
            object.__setattr__(self, "step", "ordered")
        object.__setattr__(self, "_family", unit_family(self.unit))
        if self.kind in ("integer", "real") and not self.lower <= self.upper:
            raise KnobError(f"{self.name}: empty bounds [{self.lower}, {self.upper}]")

    @classmethod
    def from_row(cls, row: SettingRow) -> Knob:
        """The knob exactly as a server describes it (unit, type, choices), unbounded.

        Lets code outside the catalogue read and compare any setting's values with the one
        parser in this module, e.g. to verify '16MB' took effect as setting '16384' (kB).
        """
        if row.vartype not in ("integer", "real", "enum", "bool"):
            raise KnobError(f"{row.name}: vartype {row.vartype!r} has no typed values")
        kind: Kind = row.vartype  # type: ignore[assignment]
        return cls(
            name=row.name,
            kind=kind,
            unit=row.unit or None,
            lower=-math.inf,
            upper=math.inf,
            default=row.boot_val or row.setting,
            choices=tuple(row.enumvals or ()),
            context=row.context,
        )

    @property
    def needs_restart(self) -> bool:
        """A postmaster-context setting only takes effect after a server restart."""
        return self.context == "postmaster"

    # -- parsing -------------------------------------------------------------------------------

    def accepted(self) -> str:
        """Human description of what this knob accepts, for error messages."""
        if self.kind == "bool":
            return "on/off, true/false, yes/no, 1/0 (or a unique prefix)"
        if self.kind == "enum":
            return "one of " + ", ".join(self.choices)
        what = "an integer" if self.kind == "integer" else "a number"
        if self._family is None:
            units = "no unit"
        elif self._family[0] == "memory":
            units = f"a memory unit B, kB, MB, GB, TB (bare numbers are in {self.unit})"
        else:
            units = f"a time unit us, ms, s, min, h, d (bare numbers are in {self.unit})"
        return f"{what} with {units}, within [{self.format(self.lower)}, {self.format(self.upper)}]"

    def _bad(self, text: str, why: str = "") -> KnobValueError:
        detail = f" ({why})" if why else ""
        return KnobValueError(
            f"invalid value for {self.name}: {text!r}{detail}; accepted: {self.accepted()}"
        )

    def parse(self, text: str) -> float | str:
        """PostgreSQL text -> number in the base unit, or the canonical enum/bool string.

        Accepts exactly what PostgreSQL 15 accepts (syntax and integer range). It does not
        enforce the search bounds, since a server may legitimately run outside them: use
        :meth:`validate` for that. Raises :class:`KnobValueError` and nothing else.
        """
        if not isinstance(text, str):
            raise KnobValueError(
                f"invalid value for {self.name}: expected a string, got {type(text).__name__}"
            )
        if self.kind == "bool":
            b = parse_bool(text)
            if b is None:
                raise self._bad(text)
            return "on" if b else "off"
        if self.kind == "enum":
            for c in self.choices:  # parse_enum compares case-insensitively, no prefixes
                if c.lower() == text.lower():
                    return c
            for alias, target in self.aliases:
                if alias.lower() == text.lower() and target in self.choices:
                    return target
            if "on" in self.choices and "off" in self.choices:
                # enums like synchronous_commit and huge_pages also take the hidden
                # boolean spellings true/false/yes/no/1/0 (exact words, not prefixes)
                lw = text.lower()
                if lw in ("true", "yes", "1"):
                    return "on"
                if lw in ("false", "no", "0"):
                    return "off"
            raise self._bad(text)
        return self._parse_number(text)

    def _parse_number(self, text: str) -> float:
        if self.kind == "integer":
            got = _strtol(text)
            if got is not None:
                val: float = float(got[0])
                end, overflow = got[1], got[2]
            else:
                val, end, overflow = 0.0, 0, False
            # PostgreSQL re-parses as a float when strtol stops at '.', 'e' or overflows
            if got is None or overflow or text[end : end + 1] in (".", "e", "E"):
                d = _strtod(text)
                if d is None or d[2]:
                    raise self._bad(text)
                val, end = d[0], d[1]
        else:
            d = _strtod(text)
            if d is None or d[2]:
                raise self._bad(text)
            val, end = d[0], d[1]
        if math.isnan(val):
            raise self._bad(text)
        rest = text[end:].lstrip(_C_SPACE)
        if rest:
            if self._family is None or self.unit is None:
                raise self._bad(text, "this setting takes no unit")
            conv = _convert_unit_suffix(val, rest, self.unit)
            if conv is None:
                raise self._bad(text, "invalid unit; units are case-sensitive")
            val = conv
        if self.kind == "integer":
            val = _rint(val)
            if not _INT_MIN <= val <= _INT_MAX:
                raise self._bad(text, "value exceeds integer range")
        elif math.isinf(val):
            raise self._bad(text, "value out of range")
        return val

    def validate(self, text: str) -> float | str:
        """Parse and also require the value to be inside this knob's (search) bounds."""
        v = self.parse(text)
        if isinstance(v, float) and not self.lower <= v <= self.upper:
            raise self._bad(text, "outside the allowed range")
        return v

    # -- formatting ----------------------------------------------------------------------------

    def format(self, value: float | str) -> str:
        """Value -> PostgreSQL syntax, with the largest unit that represents it exactly."""
        if isinstance(value, str):
            value = self.parse(value)
            if isinstance(value, str):
                return value
        if self.kind in ("enum", "bool"):
            idx = int(value)
            if not 0 <= idx < len(self.choices):
                raise KnobValueError(f"{self.name}: no choice with index {idx}")
            return self.choices[idx]
        v = float(value)
        if not math.isfinite(v):
            raise KnobValueError(f"{self.name}: cannot format {value!r}")
        if self.kind == "real":
            s = f"{v:.15g}"
            return s + (self.unit or "") if v != 0 and self._family else s
        iv = int(_rint(v))
        if iv == 0 or iv < 0 or self._family is None:
            return str(iv)  # 0 and sentinels such as -1 are always written bare
        fam, base = self._family
        table = _MEMORY_UNITS if fam == "memory" else _TIME_UNITS
        atom = 1.0 if fam == "memory" else 0.001  # bytes, or microseconds: every unit is whole
        total = iv * round(base / atom)  # exact integer arithmetic, no float tolerance
        for name, size in table:
            unit_atoms = round(size / atom)
            if total % unit_atoms == 0:
                return f"{total // unit_atoms}{name}"
        return str(iv)  # pragma: no cover - the smallest unit always divides

    # -- choices ---------------------------------------------------------------------------------

    def index(self, value: str) -> int:
        """Position of an enum/bool value in the ordered choices."""
        v = self.parse(value)
        assert isinstance(v, str)
        return self.choices.index(v)


def _parse_bound(row: SettingRow, text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError as exc:
        raise KnobError(f"{row.name}: pg_settings bound {text!r} is not a number") from exc


def current_value(knob: Knob, row: SettingRow) -> float | None:
    """The server's value of a numeric knob (``row.setting``) in the knob's unit, or None."""
    if knob.kind not in ("integer", "real"):
        return None
    try:
        raw = float(row.setting)
    except (TypeError, ValueError):
        return None
    return convert_unit(raw, row.unit, knob.unit)


def narrow(knob: Knob, row: SettingRow) -> Knob:
    """Intersect a knob with what the server reports in ``pg_settings``.

    min_val/max_val are in the row's ``unit`` (e.g. shared_buffers in '8kB' pages), so they
    are converted to the knob's base unit first. The server's ``context`` wins (it is the
    authority on whether a restart is needed). The server's current value (``row.setting``)
    is always inside the result: a range that left it out would replace the server's own
    value with a clamped one that no run measured. Raises :class:`KnobError` when nothing is
    left.
    """
    if row.name != knob.name:
        raise KnobError(f"pg_settings row {row.name!r} does not describe knob {knob.name!r}")
    expected = {"integer": "integer", "real": "real", "enum": "enum", "bool": "bool"}[knob.kind]
    if row.vartype != expected:
        raise KnobError(
            f"{knob.name}: server reports vartype {row.vartype!r}, catalogue expects {expected!r}"
        )
    ctx = row.context or knob.context
    if knob.kind == "enum":
        server = {v.lower() for v in (row.enumvals or ())}
        choices = tuple(c for c in knob.choices if c.lower() in server) if server else knob.choices
        if not choices:
            raise KnobError(
                f"{knob.name}: none of {', '.join(knob.choices)} is accepted by this server "
                f"(it accepts {', '.join(row.enumvals or ())}); remove the knob from the set"
            )
        default = knob.default if knob.default in choices else choices[0]
        return replace(knob, choices=choices, default=default, context=ctx)
    if knob.kind == "bool":
        return replace(knob, context=ctx)
    lo_raw, hi_raw = _parse_bound(row, row.min_val), _parse_bound(row, row.max_val)
    lo, hi = knob.lower, knob.upper
    try:
        srv_lo = convert_unit(lo_raw, row.unit, knob.unit) if lo_raw is not None else -math.inf
        srv_hi = convert_unit(hi_raw, row.unit, knob.unit) if hi_raw is not None else math.inf
        lo, hi = max(lo, srv_lo), min(hi, srv_hi)
        cur = current_value(knob, row)
    except KnobError as exc:
        raise KnobError(f"{knob.name}: {exc}") from exc
    if knob.kind == "integer":
        lo, hi = float(math.ceil(lo - 1e-9)), float(math.floor(hi + 1e-9))
    if cur is not None and srv_lo <= cur <= srv_hi:
        # The server's own value always lies in the range (issue 29: a catalogue bound of
        # cpus//2 once clamped max_parallel_workers_per_gather=2 to 1 without a word).
        lo, hi = min(lo, cur), max(hi, cur)
    if lo > hi:
        raise KnobError(
            f"{knob.name}: the safe range [{knob.format(knob.lower)}, {knob.format(knob.upper)}] "
            f"does not overlap the server's [{row.min_val}, {row.max_val}] "
            f"({row.unit or 'no unit'}); remove the knob from the set"
        )
    return replace(knob, lower=lo, upper=hi, context=ctx)
