"""Which test runs each marked shell block of README.md and docs/ (see docs/contributing.md).

NAME -> "path/to/test_file.py::test_function". The function must read its block with
``tests.docs.blocks.command("NAME")``: tests/docs/test_marked.py checks that it names it.
"""

from __future__ import annotations

_STEPS = "tests/docs/test_readme_steps.py"
_PG18 = "tests/app/postgres/test_pg18.py"
_CLI = "tests/docs/test_cli_commands.py"
_SESSIONS = "tests/docs/test_cli_sessions.py"
_FRESH = "tests/docs/test_fresh_copy.py"
_SITE = "tests/docs/test_site.py"
_RESULTS = "tests/docs/test_results_commands.py"
_QUALITY = "tests/docs/test_results_quality.py"
_PARSE = "tests/docs/test_results_parse.py::test_the_command_parses"
_CAPTURES = "tests/docs/test_captures.py"
_CAPTURE_RESULTS = "tests/docs/test_results_captures.py"
_ORDER = "tests/docs/test_results_search_order.py::test_the_search_order_command_runs"
_STEADY = "tests/docs/test_results_steady.py::test_the_steady_state_command_runs"

COMMANDS: dict[str, str] = {
    # docs/configuration.md
    "sandbox-version": f"{_PG18}::test_the_manuals_commands_make_an_18_sandbox",
    # README.md
    "demo": f"{_FRESH}::test_setup_and_demo_from_a_fresh_copy",
    "tests": f"{_SITE}::test_ci_runs_the_test_command_readme_shows",
    "tests-fast": f"{_SITE}::test_the_fast_lane_collects_no_slow_test",
    "activate": f"{_FRESH}::test_setup_and_demo_from_a_fresh_copy",
    "step-register": f"{_STEPS}::test_five_steps_on_a_server_of_ones_own",
    "step-run": f"{_STEPS}::test_five_steps_on_a_server_of_ones_own",
    "step-read": f"{_STEPS}::test_five_steps_on_a_server_of_ones_own",
    "step-apply": f"{_STEPS}::test_five_steps_on_a_server_of_ones_own",
    "step-rollback": f"{_STEPS}::test_five_steps_on_a_server_of_ones_own",
    # docs/getting-started.md
    "setup-demo": f"{_FRESH}::test_setup_and_demo_from_a_fresh_copy",
    "activate-anywhere": f"{_FRESH}::test_setup_and_demo_from_a_fresh_copy",
    "serve": f"{_CLI}::test_serve",
    "run-tests": f"{_SITE}::test_ci_runs_the_test_command_readme_shows",
    # docs/tuning.md, docs/reading-results.md, docs/cli.md, docs/workloads.md
    "tuning-targets": f"{_SESSIONS}::test_targets_cancel_export_and_rollback_with_yes",
    "tuning-cancel": f"{_SESSIONS}::test_targets_cancel_export_and_rollback_with_yes",
    "tuning-rollback-yes": f"{_SESSIONS}::test_targets_cancel_export_and_rollback_with_yes",
    "reading-export": f"{_SESSIONS}::test_targets_cancel_export_and_rollback_with_yes",
    "cli-help": f"{_CLI}::test_cli_help",
    "tune-tpch": f"{_CLI}::test_tune_tpch_keeps_the_power_test_single_client",
    "sweep-cli": f"{_CLI}::test_sweep_cli",
    # docs/compare.md
    "compare-register": "tests/docs/test_compare.py::test_compare_commands",
    "compare-run": "tests/docs/test_compare.py::test_compare_commands",
    "compare-file": "tests/docs/test_compare.py::test_compare_commands",
    # docs/rest.md
    "rest-walkthrough": (
        "tests/acceptance/test_readme.py::test_rest_walkthrough_in_a_fresh_directory"
    ),
    # docs/configuration.md, docs/contributing.md
    "compose-up": f"{_SITE}::test_compose_command_names_a_valid_compose_file",
    "docs-build": f"{_SITE}::test_manual_builds_in_strict_mode",
    "fast-lane": f"{_SITE}::test_the_fast_lane_collects_no_slow_test",
    # docs/security.md
    "restart-methods": (
        "tests/security/test_restart.py::test_the_documented_methods_are_valid_settings"
    ),
    # docs/profiles.md
    "profiles-add": "tests/e2e/test_cli_profiles.py::test_targets_add_with_a_profile_and_remove",
    "profiles-demo": (
        "tests/e2e/test_cli_profiles.py::test_demo_with_a_profile_runs_in_its_cgroup_and_removes_it"
    ),
    # docs/captures.md
    "captures-run": f"{_CAPTURES}::test_capture_replay_workflow",
    "captures-show": f"{_CAPTURES}::test_capture_replay_workflow",
    "captures-import": f"{_CAPTURES}::test_capture_replay_workflow",
    "captures-restore": f"{_CAPTURES}::test_capture_replay_workflow",
    "captures-tune": f"{_CAPTURES}::test_capture_replay_workflow",
    "captures-delete": f"{_CAPTURES}::test_capture_replay_workflow",
    # docs/results/: one command per bench script runs small, every other one is parsed
    # by its script's parser (_PARSE, which parses the ones that run too)
    "results-demo": f"{_FRESH}::test_setup_and_demo_from_a_fresh_copy",
    "results-tpch-h1": _PARSE,
    "results-tpcc-c1": _PARSE,
    "results-tpcc-c1-compare": _PARSE,
    "results-tpcc-c2-headroom": _PARSE,
    "results-tpcc-c2-small": _PARSE,
    "results-chbench-ch1": _PARSE,
    "results-e2e": _PARSE,
    "results-tpcb-b1-small": _PARSE,
    "results-tpcb-b2-headroom": _PARSE,
    "results-tpcb-b2-micro": _PARSE,
    "results-tpcb-d1-disk": _PARSE,
    "results-tpcb-d1-steady": _STEADY,
    "results-duet": "tests/docs/test_results_duet.py::test_the_duet_command_runs",
    "results-search-order": _ORDER,  # bench/e2e.py's small run too
    "results-search-order-analytic": _ORDER,  # where the host has no cgroups
    "results-sweep": f"{_RESULTS}::test_results_sweep",
    "results-long-queries": f"{_RESULTS}::test_results_long_queries",
    "results-search-quality": f"{_QUALITY}::test_results_search_quality",
    "results-neighbour": f"{_QUALITY}::test_results_neighbour",
    "results-faults": f"{_QUALITY}::test_results_faults",
    "results-api-load": f"{_RESULTS}::test_results_api_load",
    "results-operations": f"{_RESULTS}::test_results_operations",
    "results-capture-overhead": f"{_CAPTURE_RESULTS}::test_results_capture_overhead",
    "results-capture-overhead-small": _PARSE,
    "results-replay-fidelity": f"{_CAPTURE_RESULTS}::test_results_replay_fidelity",
}
