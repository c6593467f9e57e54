"""bench/e2e.py as the TPC-C pages (C1: a session, then the comparison; C2: on profile
small, its default against itself, and sessions on a settled server) show it, run small
(tests/docs/results_cmds.py).

One module per page group: the suite hands out whole modules to its workers."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from bench.e2e import parser
from tests.docs.blocks import command
from tests.docs.results_cmds import run_e2e
from tests.helpers import needs_cgroups


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("name", "out", "options"),
    [
        ("results-tpcc-c1", "e2e-C1.json", {}),
        ("results-tpcc-c1-compare", "e2e-C1-compare.json", {}),
        # C2's session path, settling included, without rounds (its other commands,
        # sessions and a comparison, only differ in numbers: test_the_other_c2_commands_parse)
        pytest.param(
            "results-tpcc-c2-330",
            "bench/results/e2e-C2-small-330.json",
            {"rounds": "0", "final_check_runs": "0"},
            marks=needs_cgroups,
        ),
        # C2's comparison path
        pytest.param(
            "results-tpcc-c2-spread",
            "bench/results/e2e-C2-small-spread.json",
            {},
            marks=needs_cgroups,
        ),
    ],
)
def test_the_page_command_runs(
    name: str, out: str, options: dict[str, str], tmp_path: Path
) -> None:
    doc = run_e2e(name, out, tmp_path, **options)
    if name == "results-tpcc-c2-330":
        c2 = doc["workloads"]["C2"]
        # the server ran the workload before the session, its levels recorded; the
        # session's record stands alone, with no confirmation
        assert c2["data"]["settle_tps"][0] > 0, c2
        assert c2["session"]["trials"] >= 1, c2["session"]
        assert c2["confirmation"] is None
        assert c2["server_in_cgroup"]["after_session"]["all_inside"], c2["server_in_cgroup"]


@pytest.mark.parametrize(
    ("name", "compared"),
    [
        ("results-tpcc-c2-small", None),
        ("results-tpcc-c2-600", None),
        ("results-tpcc-c2-settled", None),
        ("results-tpcc-c2-330-guard", None),
        ("results-tpcc-c2-keep", None),
        ("results-tpcc-c2-steady-pgtune", {"pgtune"}),
    ],
)
def test_the_other_c2_commands_parse(name: str, compared: set[str] | None) -> None:
    """The page's other C2 commands: the same workload, profile and code path as the
    settled session or the spread comparison the test above runs, with other numbers;
    each still parses, and a comparison's configs are JSON."""
    (line,) = [x for x in command(name).splitlines() if "bench/e2e.py" in x]
    argv = shlex.split(line)
    args = parser().parse_args(argv[argv.index("bench/e2e.py") + 1 :])
    assert (args.workloads, args.profile) == ("C2", "small")
    assert (None if args.compare is None else set(json.loads(args.compare))) == compared
