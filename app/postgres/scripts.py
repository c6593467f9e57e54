"""User pgbench scripts: read as pgbench 15-17 read them, with an allowlist of meta-commands.

A custom script is pgbench's, and pgbench's ``\\shell`` and ``\\setshell`` run a shell
command on the host that runs pgbench: the knobtune service. So every script is parsed
here before it is accepted, and only meta-commands that cannot reach the operating
system pass (:data:`ALLOWED`). :func:`check_script` is the one check; the request
schemas (app/workloads/schemas.py ``ScriptIn``) call it, so every way in (REST, CLI, dashboard,
schedules, stored sessions being resumed) goes through it, and the pgbench runner and
the preflight call it again before they write a script to disk.

Where pgbench sees a meta-command
---------------------------------
pgbench (``ParseScript`` in pgbench.c) lexes a script with psql's SQL lexer
(src/fe_utils/psqlscan.l, with ``standard_conforming_strings`` on and a single-byte
encoding) and starts a meta-command at *any* backslash that lexer meets outside quotes
and comments, not only at the start of a line: ``SELECT 1 \\gset`` is a query and a
``\\gset``; ``\\;`` and ``\\:`` are the only exceptions. The command's name is then
the next word of pgbench's own word lexer (src/bin/pgbench/exprscan.l): spaces
(`` \\t\\r\\f\\v``) and line continuations (a backslash before ``\\n`` or ``\\r\\n``)
are skipped first, so ``\\ shell`` and a backslash alone at the end of a line followed
by ``shell`` on the next are both ``\\shell``; names compare case-insensitively
(``\\SHELL``). The command ends at the first newline that is not a continuation.
Inside the SQL lexer, ``\\r`` ends a ``--`` comment, ``E''`` strings take backslash
escapes, ``''`` strings do not, strings continue across a newline into a following
quote (``'a'`` newline ``'b'``) in the state they started in, ``/* */`` comments nest,
``$tag$`` quotes are opaque, and a letter that follows a number or an identifier
(``1E'x'``, ``fooE'x'``) is not a string prefix. This module ports those rules
(:class:`_Lexer`); tests/security/test_scripts.py checks them against the installed
pgbench (9,000 random scripts agreed with pgbench 15 when it was written).

The check runs inside request validation, on the event loop, so it is linear and
mostly runs in the regex engine: 100 kB of pgbench-style SQL takes about 25 ms of CPU,
the slowest text found (9,000 meta-commands in 81 kB) about 50 ms; a script may have
at most :data:`MAX_COMMANDS` commands.

Belt and braces
---------------
pgbench versions differ in small ways (16 added ``0x`` integers and ``_`` in numbers;
17 added ``\\syncpipeline``). So besides the parse, the text is searched for
``\\shell`` and ``\\setshell`` as pgbench's word lexer would find them after *any*
backslash, inside strings and comments too: a parser difference cannot let one
through, at the price of refusing such text in a comment or string literal.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

# Meta-commands that stay inside pgbench: variables, sleeping, conditionals, storing
# query results, pipelines (\syncpipeline is pgbench 17's; older pgbench refuses it and
# the preflight says so).
ALLOWED = (
    "set",
    "sleep",
    "if",
    "elif",
    "else",
    "endif",
    "gset",
    "aset",
    "startpipeline",
    "syncpipeline",
    "endpipeline",
)
SHELL = ("shell", "setshell")  # run a command through the OS shell: never allowed
_ALLOWED_TEXT = ", ".join("\\" + name for name in ALLOWED)
MAX_COMMANDS = 10_000  # pgbench has no limit; a benchmark script of this many is a mistake


class ScriptError(ValueError):
    """A script knobtune will not run; the message names the line and what to change."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.reason = message


@dataclass(frozen=True, slots=True)
class Command:
    """One command as pgbench splits a script: an SQL statement or a meta-command."""

    line: int  # 1-based line of its first character (a meta-command's backslash)
    meta: str | None  # the meta-command's name as written (None: SQL)
    args: tuple[str, ...] = ()

    @property
    def name(self) -> str | None:
        """The meta-command's name as pgbench compares it (ASCII case folded)."""
        return _ascii_lower(self.meta) if self.meta is not None else None


def _ascii_lower(s: str) -> str:
    # pg_strcasecmp folds ASCII letters only
    return s.translate(_LOWER)


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


# -- psqlscan.l's INITIAL rules ------------------------------------------------------------
# flex takes the longest match and, on a tie, the first rule. Non-ASCII characters are
# one or more bytes in \200-\377 to flex, which every class below treats alike.
_HI = "\x80-\U0010ffff"
_IDENT_START = f"[A-Za-z_{_HI}]"
_IDENT_CONT = f"[A-Za-z_0-9${_HI}]"
_IDENT = f"{_IDENT_START}{_IDENT_CONT}*+"
_DOLQ_START = f"[A-Za-z_{_HI}]"
_DOLQ_CONT = f"[A-Za-z_0-9{_HI}]"
_VAR = f"[A-Za-z_0-9{_HI}]"
_OP = r"[~!@#^&|`?+\-*/%<>=]"
_DEC = r"[0-9](?:_?[0-9])*+"
_NUMERIC = rf"(?:{_DEC}\.(?:{_DEC})?|\.{_DEC})"
_REAL = rf"(?:{_NUMERIC}|{_DEC})[Ee][-+]?{_DEC}"

# The rules a token can start with, for the characters the fast paths below leave to
# them (quote prefixes, $, :, \, digits and '.'): (first characters, pattern, action).
# Actions: ("state", name) enter a quoted state after the match; ("skip", n) and
# ("back", n) keep n characters or drop the last n (flex's yyless); ("dolq",);
# ("backslash",); ("ident",); ("token",).
_DIGITS = "0123456789"
_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("bB", r"[bB]'", ("state", "xb")),
    ("xX", r"[xX]'", ("state", "xh")),
    ("nN", r"[nN]'", ("skip", "1")),
    ("eE", r"[eE]'", ("state", "xe")),
    ("uU", r"[uU]&'", ("state", "xus")),
    ("$", rf"\$(?:{_DOLQ_START}{_DOLQ_CONT}*)?\$", ("dolq",)),
    ("$", rf"\${_DOLQ_START}{_DOLQ_CONT}*", ("skip", "1")),
    ("uU", r'[uU]&"', ("state", "xui")),
    ("uU", r"[uU]&", ("skip", "1")),
    (":.", r"::|\.\.|:=", ("token",)),
    ("\\", r"\\[;:]", ("token",)),
    ("\\", r"\\", ("backslash",)),
    (":", rf":{_VAR}+|:'{_VAR}+'|:\"{_VAR}+\"|:\{{\?{_VAR}+\}}", ("token",)),
    (":", rf":'{_VAR}*|:\"{_VAR}*|:\{{\?{_VAR}*|:\{{", ("skip", "1")),
    (":.", r"[:.]", ("token",)),
    ("$", rf"\${_DEC}", ("token",)),
    ("$", rf"\${_DEC}{_IDENT}", ("token",)),
    (_DIGITS, _DEC, ("token",)),
    ("0", r"0[xX](?:_?[0-9A-Fa-f])+", ("token",)),
    ("0", r"0[oO](?:_?[0-7])+", ("token",)),
    ("0", r"0[bB](?:_?[01])+", ("token",)),
    ("0", r"0[xXoObB]_?", ("token",)),
    (_DIGITS + ".", _NUMERIC, ("token",)),
    (_DIGITS, rf"{_DEC}\.\.", ("back", "2")),
    (_DIGITS + ".", _REAL, ("token",)),
    (_DIGITS + ".", rf"(?:{_NUMERIC}|{_DEC})[Ee][-+]", ("token",)),
    (_DIGITS, rf"{_DEC}{_IDENT}", ("token",)),
    (_DIGITS + ".", rf"{_NUMERIC}{_IDENT}", ("token",)),
    (_DIGITS + ".", rf"{_REAL}{_IDENT}", ("token",)),
    ("bBxXnNeEuU", _IDENT, ("ident",)),
]
_Rule = tuple[re.Pattern[str], tuple[str, ...]]
_OTHER: _Rule = (re.compile(r"[^\n]"), ("token",))  # flex's ".": any one character
_ONLY_OTHER = [_OTHER]


# The patterns below are compiled on first use, not at import: compiling them takes about
# 0.3 s of CPU, and most processes that import this module (every CLI call, the service)
# never check a script.
@functools.cache
def _by_first() -> dict[str, list[_Rule]]:
    rules: dict[str, list[_Rule]] = {}
    for firsts, pattern, action in _RULES:
        for c in firsts:
            rules.setdefault(c, []).append((re.compile(pattern), action))
    for first in rules.values():
        first.append(_OTHER)
    return rules


# Skipping what cannot hold a meta-command, at the regex engine's speed (a script is
# checked on every request, while the event loop waits). Each alternative consumes one
# token (a whole string) the way flex's longest match and yyless do; the skip stops
# where Python has work: a backslash, a /* comment (they nest), a $tag$ quote, ; ( )
# (statement splitting) and, while a statement's head is being read, an identifier.
_BODY_XQ = r"(?:[^']++|'')*+"  # '' doubles a quote
_BODY_XE = r"(?:[^\\']++|''|\\[\s\S]|\\\Z)*+"  # a backslash takes the next character
_BODY_XB = r"[^']*+"  # B'' and X'': no doubling
# after a closing quote: spaces and -- comments with a newline, then a quote: continued
_QC = r"(?:[ \t\f]|--[^\n\r]*+)*+[\n\r](?:[ \t\n\r\f]++|--[^\n\r]*+[\n\r])*+'"


def _quoted(body: str) -> str:
    """A string from after its opening quote: body, then closing quote and any
    continuations (each in the same state), or the end of the text."""
    return rf"{body}(?:'(?:{_QC}{body}(?:'|\Z))*+|\Z)"


# flex takes the longest of these; a regex the first that matches, so the order matters.
# An exponent without a sign is also the start of an identifier: numeric_junk and
# decinteger_junk take it and whatever identifier characters follow ($ too), as much as
# real and real_junk or more (1.5e1$a$ is one token, not 1.5e1 then a dollar quote).
_NUM = (
    rf"(?:(?:{_NUMERIC}|{_DEC})[Ee][-+]{_DEC}(?:{_IDENT})?"  # real, real_junk (signed)
    rf"|(?:{_NUMERIC}|{_DEC})[Ee][-+]"  # realfail: one token (15+; 14 gave back e-)
    rf"|{_DEC}(?=\.\.)"  # numericfail: the .. goes back
    rf"|{_NUMERIC}(?:{_IDENT})?"  # numeric, numeric_junk (and an unsigned real)
    rf"|{_DEC}(?:{_IDENT})?)"  # decinteger, decinteger_junk (0x.., 0o.., 0b.. too)
)
_TOKENS = [
    r"[ \t\n\r\f]++",
    r"--[^\n\r]*+",
    rf"'{_quoted(_BODY_XQ)}",
    r'"(?:[^"]++|"")*+(?:"|\Z)',
    rf"[bBxX]'{_quoted(_BODY_XB)}",
    rf"[eE]'{_quoted(_BODY_XE)}",
    rf"[uU]&'{_quoted(_BODY_XQ)}",
    r'[uU]&"(?:[^"]++|"")*+(?:"|\Z)',
    r"[nN](?=')",  # N'': the N alone, the next token is the string
    "IDENT",
    _NUM,
    rf"\${_DEC}(?:{_IDENT})?",  # param, param_junk
    # a $ that starts no dollar quote (dolqfailed keeps only the $); at one that does,
    # the skip stops: Python finds its end
    rf"\$(?!(?:{_DOLQ_START}{_DOLQ_CONT}*+)?\$)",
    rf":'{_VAR}++'|:\"{_VAR}++\"|:\{{\?{_VAR}++\}}|:{_VAR}++|::|:=|:",
    r"\.\.|\.",
    r"\\[;:]",
    rf"(?:(?!--|/\*){_OP})++",  # operators end where a comment starts
    rf"[^\\'\"$:.;()0-9A-Za-z_{_HI}~!@#^&|`?+\-*/%<>= \t\n\r\f]++",
]
_ROUTINE_WORD = rf"(?:[bB][eE][gG][iI][nN]|[cC][aA][sS][eE]|[eE][nN][dD])(?!{_IDENT_CONT})"


def _skip(ident: str | None) -> re.Pattern[str]:
    tokens = [t if t != "IDENT" else ident for t in _TOKENS]
    return re.compile("(?:" + "|".join(t for t in tokens if t is not None) + ")*+")


@functools.cache
def _skips() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(all, a statement's head, a function body): a head's first identifiers are read one
    by one; a body's BEGIN, CASE and END too."""
    return _skip(_IDENT), _skip(None), _skip(rf"(?!{_ROUTINE_WORD}){_IDENT}")


_LEADING_SPACE = re.compile(r"(?:[ \t\n\r\f\v]++|--[^\n\r]*+)*+")
_IDENT_RE = re.compile(_IDENT)
_PUNCT = re.compile(r"[();]++")
# inside a comment, a string or a quoted identifier: what ends or nests it
_XC_EVENT = re.compile(r"/\*|\*/")  # \*+/ closes where its last * does
_XE_EVENT = re.compile(r"[\\']")
# a string that ends at a quote continues after spaces and -- comments with a newline
_QUOTE_CONTINUE = re.compile(
    r"(?:[ \t\f]|--[^\n\r]*+)*+[\n\r](?:[ \t\n\r\f]++|--[^\n\r]*+[\n\r])*+'"
)
_DOLQ_DELIM = re.compile(rf"\$(?:{_DOLQ_START}{_DOLQ_CONT}*)?\$")
# exprscan.l: a line continuation, and the characters between words
_CONTINUATION = re.compile(r"\\\r?\n")
_WORD_SPACE = re.compile(r"[ \t\r\f\v]+")


class _Lexer:
    """psqlscan.l's rules as pgbench uses them, reduced to what splits a script.

    Linear in the script's length: a script is checked on every request.
    """

    def __init__(self, text: str) -> None:
        self.s = text
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.commands: list[Command] = []
        self.paren = 0
        self.begin_depth = 0
        self.idents = ["", "", "", ""]  # first letters of a CREATE [OR REPLACE] FUNCTION head
        self.ident_count = 0
        self.in_routine = False
        self.sql_start: int | None = None  # where the pending SQL command starts

    def line_at(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def _sql_char(self, pos: int) -> None:
        # pgbench skips leading isspace() characters of a command: \v is one, though
        # the SQL lexer does not count it as a space
        if self.sql_start is None and self.s[pos] != "\v":
            self.sql_start = pos

    def _flush_sql(self) -> None:
        if self.sql_start is not None:
            self.commands.append(Command(self.line_at(self.sql_start), None))
            self.sql_start = None

    def run(self) -> list[Command]:
        s, n, i = self.s, len(self.s), 0
        skip_all, skip_head, skip_routine = _skips()
        while i < n:
            if self.ident_count == 0 or (self.idents[0] == "c" and self.ident_count < 4):
                skip = skip_head
            elif self.in_routine:
                skip = skip_routine
            else:
                skip = skip_all
            m = skip.match(s, i)
            assert m is not None
            if m.end() > i:
                lead = _LEADING_SPACE.match(s, i, m.end())
                assert lead is not None
                if lead.end() < m.end():
                    self._sql_char(lead.end())
                i = m.end()
                continue
            c = s[i]
            if c == "\\":
                self._flush_sql()
                i = self._meta(i)
                if len(self.commands) > MAX_COMMANDS:
                    raise _too_long(self.line_at(i))
                continue
            self._sql_char(i)
            if c in "();":
                run = _PUNCT.match(s, i)
                assert run is not None
                for k, ch in enumerate(run.group(), start=i):
                    if self.sql_start is None:
                        self.sql_start = k
                    if ch == "(":
                        self.paren += 1
                    elif ch == ")":
                        self.paren = max(0, self.paren - 1)
                    elif self.paren == 0 and self.begin_depth == 0:
                        self._flush_sql()
                        self.ident_count = 0
                        if len(self.commands) > MAX_COMMANDS:
                            raise _too_long(self.line_at(k))
                i = run.end()
            elif s.startswith("/*", i):
                i = self._comment(i + 2)  # pgbench keeps /* */ comments in the command
            elif (dolq := _DOLQ_DELIM.match(s, i)) is not None:
                i = self._dollar(dolq.group(), dolq.end())
            elif (ident := _IDENT_RE.match(s, i)) is not None:
                self._identifier(ident.group())
                i = ident.end()
            else:  # not reached: the skip covers every other token
                i = self._token(i)
        self._flush_sql()
        return self.commands

    def _token(self, i: int) -> int:
        """flex's longest match among the rules for the character at ``i``."""
        s = self.s
        best_len, action = 0, _OTHER[1]
        for pattern, act in _by_first().get(s[i], _ONLY_OTHER):
            m = pattern.match(s, i)
            if m is not None and m.end() - i > best_len:
                best_len, action = m.end() - i, act
        kind = action[0]
        if kind == "backslash":  # not reached: _MASTER takes a lone backslash
            self._flush_sql()
            return self._meta(i)
        if kind == "state":
            if action[1] == "xui":
                return self._identifier_quoted(i + best_len)
            return self._string(action[1], i + best_len)
        if kind == "dolq":
            return self._dollar(s[i : i + best_len], i + best_len)
        if kind == "skip":
            return i + int(action[1])
        if kind == "back":
            return i + best_len - int(action[1])
        if kind == "ident":
            self._identifier(s[i : i + best_len])
        elif s.startswith("\\;", i):
            self.ident_count = 0
        return i + best_len

    def _operators(self, i: int, run: str) -> int:
        """A run of operator characters: it ends where a comment starts (/* or --)."""
        cuts = [k for k in (run.find("/*"), run.find("--")) if k > 0]
        return i + (min(cuts) if cuts else len(run))

    def _identifier(self, word: str) -> None:
        """psqlscan's BEGIN ... END tracking inside CREATE FUNCTION/PROCEDURE bodies."""
        low = _ascii_lower(word)
        if self.ident_count == 0:
            self.idents = ["", "", "", ""]
        keyword = low in ("create", "function", "procedure", "or", "replace")
        if keyword and self.ident_count < len(self.idents):
            self.idents[self.ident_count] = low[0]
        self.ident_count += 1
        head = self.idents
        self.in_routine = head[0] == "c" and (
            head[1] in ("f", "p") or (head[1] == "o" and head[2] == "r" and head[3] in ("f", "p"))
        )
        if self.in_routine and self.paren == 0:
            if low == "begin" or (low == "case" and self.begin_depth >= 1):
                self.begin_depth += 1  # CASE ends with END too
            elif low == "end" and self.begin_depth > 0:
                self.begin_depth -= 1

    def _comment(self, i: int) -> int:
        """Past a /* */ comment whose text starts at ``i`` (they nest)."""
        depth = 0
        for m in _XC_EVENT.finditer(self.s, i):
            if m.group() == "/*":
                depth += 1
            elif depth == 0:
                return m.end()
            else:
                depth -= 1
        return len(self.s)

    def _identifier_quoted(self, i: int) -> int:
        """Past a "quoted identifier" whose text starts at ``i`` ("" is a quote in it)."""
        s = self.s
        while True:
            j = s.find('"', i)
            if j < 0:
                return len(s)
            if not s.startswith('""', j):
                return j + 1
            i = j + 2

    def _string(self, state: str, i: int) -> int:
        """Past a string whose text starts at ``i``: xq ('' standard), xe (E'' with
        backslash escapes), xb, xh (B'', X''), xus (U&'')."""
        s, n = self.s, len(self.s)
        while True:
            if state == "xe":
                m = _XE_EVENT.search(s, i)
                j = m.start() if m is not None else -1
                if j >= 0 and s[j] == "\\":
                    i = j + 2  # an escape takes the next character, a quote too
                    continue
            else:
                j = s.find("'", i)
            if j < 0:
                return n
            if state != "xb" and state != "xh" and s.startswith("''", j):
                i = j + 2  # a doubled quote
                continue
            m = _QUOTE_CONTINUE.match(s, j + 1)
            if m is None:
                return j + 1
            i = m.end()  # 'a' newline 'b': one string, in the state it started in

    def _dollar(self, tag: str, i: int) -> int:
        """Past a $tag$ quote whose text starts at ``i``: at the tag's next occurrence
        (a $...$ that is not the tag gives back its last $, so none is skipped)."""
        j = self.s.find(tag, i)
        return len(self.s) if j < 0 else j + len(tag)

    def _meta(self, i: int) -> int:
        """A meta-command whose backslash is at ``i``; return where SQL lexing resumes."""
        s, n = self.s, len(self.s)
        j = i + 1
        continued = False
        while True:  # the command ends at the first newline that is no continuation
            k = s.find("\n", j)
            if k < 0:
                j = n
                break
            j = k + 1
            # a continuation: a backslash (and \r) before it, after the command's own
            if (k - 1 > i and s[k - 1] == "\\") or (
                k - 2 > i and s[k - 1] == "\r" and s[k - 2] == "\\"
            ):
                continued = True
                continue
            break
        body = s[i + 1 : j]
        if continued:
            body = _CONTINUATION.sub(" ", body)
        words = _WORD_SPACE.split(body.strip(" \t\r\f\v\n").replace("\n", " "))
        if words[0]:  # a backslash with nothing after it on its line is no command
            self.commands.append(Command(self.line_at(i), words[0], tuple(words[1:])))
        return j


def _too_long(line: int) -> ScriptError:
    return ScriptError(
        line,
        f"the script has more than {MAX_COMMANDS} commands: a benchmark script this long "
        "is a mistake; split it, or loop with \\set and \\if",
    )


def _line_end(s: str, i: int) -> int:
    """Where a -- comment starting at ``i`` ends: at \\n or \\r (not included)."""
    ends = [k for k in (s.find("\n", i), s.find("\r", i)) if k >= 0]
    return min(ends) if ends else len(s)


def _shell_anywhere(sql: str) -> int | None:
    """Where \\shell or \\setshell is, as pgbench's word lexer would read it after any
    backslash: the name (any case) after spaces and line continuations. Anywhere, in
    strings and comments too. Linear: each name looks back over the gap before it."""
    low = sql.translate(_LOWER)  # pg_strcasecmp folds ASCII only; same length
    k = low.find("shell")
    while k >= 0:
        starts = (k, k - 3) if k >= 3 and low[k - 3 : k] == "set" else (k,)
        for start in starts:
            j = start - 1
            while j >= 0:
                c = sql[j]
                if c == "\\":
                    return j
                if c in " \t\r\f\v":
                    j -= 1
                elif c == "\n" and j >= 1 and sql[j - 1] == "\\":
                    j -= 2
                elif c == "\n" and j >= 2 and sql[j - 1] == "\r" and sql[j - 2] == "\\":
                    j -= 3
                else:
                    break
        k = low.find("shell", k + 1)
    return None


def parse(sql: str) -> list[Command]:
    """The commands of a pgbench script, in order, as pgbench 15-17 split it (``\\gset``
    and ``\\aset`` included as commands of their own)."""
    return _Lexer(sql).run()


def command_lines(sql: str) -> list[int]:
    """The line where each of pgbench's commands starts, indexed as pgbench numbers them
    in its errors ("aborted in command N"): ``\\gset``/``\\aset`` join the query before."""
    return [c.line for c in parse(sql) if c.name not in ("gset", "aset")]


def check_script(sql: str) -> list[Command]:
    """The script's commands; raise :class:`ScriptError` for anything knobtune won't run."""
    if "\x00" in sql:
        raise ScriptError(
            sql.count("\n", 0, sql.index("\x00")) + 1,
            "the script contains a NUL character (pgbench would ignore everything after "
            "it): remove it",
        )
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ScriptError(
            sql.count("\n", 0, exc.start) + 1,
            "the script contains a character that is not valid Unicode text: remove it",
        ) from None
    commands = parse(sql)
    for cmd in commands:
        if cmd.meta is None:
            continue
        if cmd.name in SHELL:
            raise ScriptError(cmd.line, _shell_refusal(cmd.meta))
        if cmd.name not in ALLOWED:
            raise ScriptError(
                cmd.line,
                f"unknown meta-command \\{_shown(cmd.meta)}: knobtune runs only {_ALLOWED_TEXT} "
                "(fix its name, or write it as SQL)",
            )
    at = _shell_anywhere(sql)
    if at is not None:
        raise ScriptError(
            sql.count("\n", 0, at) + 1,
            "the script contains \\shell or \\setshell (in a string, a comment or a "
            "meta-command's arguments): remove it; knobtune never runs shell commands "
            "from a script, wherever pgbench might read one",
        )
    return commands


def _shell_refusal(word: str) -> str:
    return (
        f"\\{_shown(word)} runs a shell command on the knobtune host, which knobtune does "
        "not allow: compute the value with \\set (e.g. \\set n random(1, 1000)) or "
        "in SQL (SELECT ... \\gset) instead"
    )


def _shown(word: str) -> str:
    """A command name for a message: at most 40 characters, no control characters."""
    cleaned = "".join(c if c.isprintable() else "?" for c in word)
    return cleaned if len(cleaned) <= 40 else cleaned[:40] + "..."
