#!/usr/bin/env python3
"""The reference's recommend search space over Planner settings, for servesim's golden.

    $(../shared/parity/setup_aisimulate.sh --with-dynamo) scripts/planner_space_reference.py \
        tests/deploy/planner_space_cases.json > tests/deploy/planner_space.golden.json

For each case of the cases file (a `planner:` recommend section, the optimization target and
SLA, the engine mode and the trace, all as a servesim recommend configuration would say them),
this calls Dynamo 1.6.1's Planner adapter the way `aisimulate recommend --stack dynamo` does
(`DynamoPlannerSweepConfigProvider.compile_recommendation` with the goal, the workload's trace
path and format, and the deployment mode), then materialises every point of the search space it
returns (`materialize_candidate` over the product of its choices, in the order they are listed,
the last fastest) and keeps the distinct `config.adapters["dynamo.planner"]` records in the order
first met. A selection the adapter refuses (`InfeasibleCandidate`) is kept as
{"infeasible": message}. It also records the load-predictor backtest (`best_by_interval`,
`losses`, `reason`) and, for a refused section, the error message.

Trace paths in the cases file are relative to it. Output: the cases, each with `expected`.
"""
import itertools
import json
import logging
import os
import sys


def main():
    logging.disable(logging.CRITICAL)
    from aisimulate.config_adapter import RecommendationAdapterContext
    from aisimulate.sweeper.provider import CandidateContext, InfeasibleCandidate, SweepContext
    from dynamo.planner.simulation.provider import DynamoPlannerSweepConfigProvider

    path = sys.argv[1]
    cases = json.load(open(path))
    base = os.path.dirname(os.path.abspath(path))
    for case in cases["cases"]:
        trace = case.get("trace")
        if trace is not None:
            full = os.path.normpath(os.path.join(base, trace["path"]))
            workload = {"trace_path": full, "trace_paths": [full], "trace_format": trace.get("format", "mooncake")}
        else:
            workload = {"trace_path": None, "trace_paths": None, "trace_format": None}
        goal = {
            "target": case["optimization"]["target"],
            "pareto_objectives": case["optimization"].get("pareto_objectives"),
            "sla": case.get("sla"),
        }
        mode = "disagg" if case.get("mode") == "disaggregated" else "agg"
        provider = DynamoPlannerSweepConfigProvider()
        sweep = SweepContext(core_search_space={"deployment_mode": [mode]}, workload=workload, goal=goal,
                             show_progress=False)
        ctx = RecommendationAdapterContext(engine={}, traffic={}, evaluation={}, optimization={}, sweep=sweep)
        try:
            plan = provider.compile_recommendation(case["planner"], ctx)
        except Exception as exc:  # the refusal is the expected result
            case["expected"] = {"error": str(exc)}
            continue
        choices = plan.fragment.choices_by_branch[mode]
        keys = list(choices)
        sample = ({"deployment_mode": "agg", "tp": 1, "attention_dp": 1} if mode == "agg" else
                  {"deployment_mode": "disagg", "prefill_tp": 1, "prefill_attention_dp": 1, "decode_tp": 1,
                   "decode_attention_dp": 1})
        settings = []
        for combo in itertools.product(*(choices[k] for k in keys)):
            selection = dict(zip(keys, combo))
            try:
                config = provider.materialize_candidate(
                    plan, selection, CandidateContext(sample=sample, backend_deployment=None)).config
            except InfeasibleCandidate as exc:
                config = {"infeasible": str(exc)}
            if config not in settings:
                settings.append(config)
        state = plan.state if isinstance(plan.state, dict) else {}
        case["expected"] = {
            "dimensions": {k: len(v) for k, v in choices.items()},
            "settings": settings,
            "load_predictor": state.get("load_predictor"),
        }
    cases["_source"] = ("made by scripts/planner_space_reference.py (aisimulate 0.13.0.dev202610130000000070 + "
                        "ai-dynamo 1.6.1, dynamo/planner/simulation/provider.py)")
    json.dump(cases, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
