"""Two revisions of the gateway on the same mock upstream, measured in turns: how a change moves
each scenario of bench/run.py (requests/s, and the p50 at one connection), on the same machine
in the same minutes.

Starts bench/mock_upstream.py and both gateways (`--before` is a command as run.py's
`--gateway-cmd` takes it, typically the older revision checked out in a worktree), then for
each round and scenario runs a warm-up and a measured wrk run on each, alternating which goes
first. Reports, per scenario, the median over the rounds of after / before (requests/s; for
latency, before's p50 / after's, so that above 1 is faster either way), and checks it against
`--min` (0.97: the budget a change to the hot path is held to).

    git worktree add /tmp/before <rev>
    .venv/bin/python bench/ab.py --rounds 3 \\
      --before 'env -C /tmp/before {python} -m gateway serve --config {config} --host {host} \\
                --port {port} --workers {workers}'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from run import (
    DEFAULT_GATEWAY_CMD,
    RESPONSES_SCENARIOS,
    SCENARIOS,
    Processes,
    Run,
    Scenario,
    Target,
    add_scenarios,
    measured,
    probe,
    run_one,
    start_gateway,
    start_mock,
    wrk_parser,
)

MIN_RATIO = 0.97
SIDES = ("before", "after")
# run.py's scenarios; the Responses API's when named (--scenarios responses,…: both revisions
# must serve it)
CHOOSABLE = SCENARIOS + RESPONSES_SCENARIOS


def ab(args: argparse.Namespace, tmp: Path) -> list[Run]:
    chosen = [s for s in CHOOSABLE if s.name in args.scenarios]
    procs = Processes(tmp)
    try:
        mock = start_mock(procs, args.chunks)
        commands = {"before": args.before, "after": args.after}
        targets = {
            side: start_gateway(procs, commands[side], mock.root, tmp, side) for side in SIDES
        }
        for target in targets.values():
            for scenario in chosen:
                probe(target, scenario, tmp)
        runs: list[Run] = []
        for round_ in range(args.rounds):
            for scenario in chosen:
                order = SIDES if round_ % 2 == 0 else SIDES[::-1]
                for side in order:
                    runs.append(_run(targets[side], scenario, args, tmp, mock))
        return runs
    finally:
        procs.close()


def _run(
    target: Target, scenario: Scenario, args: argparse.Namespace, tmp: Path, mock: Target
) -> Run:
    return run_one(target, scenario, args, tmp, {target.name: target.pid, "mock": mock.pid})


def ratios(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per scenario: each round's after / before, and their median."""
    out: dict[str, dict[str, Any]] = {}
    for scenario in dict.fromkeys(run.scenario for run in runs):
        mine = [run for run in runs if run.scenario == scenario]
        before = [run for run in mine if run.target == "before"]
        after = [run for run in mine if run.target == "after"]
        each = [_ratio(scenario, b, a) for b, a in zip(before, after, strict=True)]
        out[scenario] = {"rounds": each, "median": round(statistics.median(each), 3)}
    return out


def _ratio(scenario: str, before: Run, after: Run) -> float:
    if scenario == "latency":
        return round(before.latency_ms["p50"] / after.latency_ms["p50"], 3)
    return round(after.requests_per_s / before.requests_per_s, 3)


def report(runs: list[Run], args: argparse.Namespace) -> int:
    found = ratios(runs)
    print("| scenario | after / before, each round | median |")
    print("| --- | --- | --- |")
    for scenario, r in found.items():
        print(f"| {scenario} | {', '.join(f'{x:.3f}' for x in r['rounds'])} | {r['median']:.3f} |")
    failed = [s for s, r in found.items() if r["median"] < args.min]
    for scenario in failed:
        print(f"FAIL  {scenario}: {found[scenario]['median']:.3f} (budget {args.min})")
    results = {"runs": [vars(run) for run in runs], "ratios": found, "min": args.min}
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    errors = any(run.error_count for run in runs)
    return 2 if errors else 1 if args.check and failed else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = wrk_parser(__doc__, "ab_results.json", duration=10, warmup=2)
    parser.add_argument("--before", required=True, help="the older gateway's command")
    parser.add_argument("--after", default=DEFAULT_GATEWAY_CMD, help="the newer (this tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min", type=float, default=MIN_RATIO, help="median after / before")
    add_scenarios(parser, CHOOSABLE, default=SCENARIOS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = measured("gateway-ab-", lambda tmp: ab(args, tmp))
    return out if isinstance(out, int) else report(out, args)


if __name__ == "__main__":
    sys.exit(main())
