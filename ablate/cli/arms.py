"""`ablate arms`: every registered arm with its slot(s), extra parameters per layer and a description.

Given an experiment (name or file), the file is loaded first, so arms it registers are known, and the
table lists the experiment's arms.
"""

from __future__ import annotations

import json


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("arms", help="list the registered attention arms (or an experiment's arms)")
    parser.add_argument("experiment", nargs="?",
                        help="an experiments/*.py file or its name: load it (registering its arms) and list its arms")
    parser.add_argument("--d-model", type=int, default=768, help="width used to count parameters (default 768)")
    parser.add_argument("--n-head", type=int, default=12, help="heads used to count parameters (default 12)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_arms)


def _arms(args) -> int:
    from ablate.experiment import load_experiment
    from ablate.sizing import arm_table

    arms = None
    if args.experiment:
        experiment = load_experiment(args.experiment)  # registers the arms its file defines
        arms = experiment.arm_names()
    rows = arm_table(args.d_model, args.n_head, arms)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.experiment:
        print(f"experiment {experiment.name}: {len(rows)} arms")
    print(f"extra parameters at d_model={args.d_model}, {args.n_head} heads (H), head dim {args.d_model // args.n_head}")
    print(f"{'arm':<15} {'slot(s)':<20} {'extra/layer':>11}  description")
    for row in rows:
        extra = f"{row['extra_params_once']} once" if row["extra_params_once"] else str(row["extra_params_per_layer"])
        print(f"{row['arm']:<15} {'+'.join(row['slots']) or '-':<20} {extra:>11}  {row['description']}")
    return 0
