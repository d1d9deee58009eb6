"""`ablate arms`: every registered arm with its slot(s), extra parameters per layer and a description.

Given an experiment (name or file), the file is loaded first, so arms it registers are known, and the
table lists the experiment's arms with their parameters counted at each of its tiers (their width and
heads, with the experiment's model overrides); `--d-model/--n-head` count at one given width instead.
"""

from __future__ import annotations

import json


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("arms", help="list the registered attention arms (or an experiment's arms)")
    parser.add_argument("experiment", nargs="?",
                        help="an experiments/*.py file or its name: load it (registering its arms) and list its arms, "
                             "counted at each of its tiers")
    parser.add_argument("--d-model", type=int, help="width used to count parameters (default 768, or with an "
                                                    "experiment: each tier's)")
    parser.add_argument("--n-head", type=int, help="heads used to count parameters (default 12, or with an "
                                                   "experiment: each tier's)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (with an experiment: one row per "
                                                            "tier and arm)")
    parser.set_defaults(func=arms_command)


def arms_command(args) -> int:
    from ablate.experiment import load_experiment  # the library loads in the handler: see ablate.cli
    from ablate.sizing import arm_table

    experiment = load_experiment(args.experiment) if args.experiment else None  # registers the arms its file defines
    arms = experiment.arm_names() if experiment else None
    if experiment is not None and args.d_model is None and args.n_head is None:
        tiers = list(experiment.tiers)
        rows = [row for tier in tiers
                for row in arm_table(arms=arms, tier=tier, model=experiment.tier_overrides(tier).get("model"))]
    else:
        tiers = []
        rows = arm_table(args.d_model or 768, args.n_head or 12, arms)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if experiment is not None:
        print(f"experiment {experiment.name}: {len(arms)} arms")
    if tiers:
        _print_by_tier(rows, tiers)
        return 0
    d_model, n_head = rows[0]["d_model"], rows[0]["n_head"]
    print(f"extra parameters at d_model={d_model}, {n_head} heads (H), head dim {d_model // n_head}")
    print(f"{'arm':<15} {'slot(s)':<20} {'extra/layer':>11}  description")
    for row in rows:
        print(f"{row['arm']:<15} {'+'.join(row['slots']) or '-':<20} {_extra(row):>11}  {row['description']}")
    return 0


def _extra(row: dict) -> str:
    return f"{row['extra_params_once']} once" if row["extra_params_once"] else str(row["extra_params_per_layer"])


def _print_by_tier(rows: list[dict], tiers: list[str]) -> None:
    """A column per tier: the extra parameters per layer (or once), and the arm's total in the whole model."""
    first = {row["tier"]: row for row in rows}
    print("extra parameters per layer (or once) at each tier's shape, and in the whole model:")
    for tier in tiers:
        r = first[tier]
        print(f"  {tier}: d_model {r['d_model']}, {r['n_head']} heads (H), {r['n_kv_head']} key/value heads, "
              f"head dim {r['d_model'] // r['n_head']}, {r['n_layer']} layers")
    width = max(16, *(len(t) + 2 for t in tiers))
    print(f"{'arm':<15} {'slot(s)':<20} " + " ".join(f"{t:>{width}}" for t in tiers) + "  description")
    by_arm: dict[str, dict] = {}
    for row in rows:
        by_arm.setdefault(row["arm"], {})[row["tier"]] = row
    for arm, cells in by_arm.items():
        some = next(iter(cells.values()))
        shown = " ".join(f"{_extra(cells[t]) + ' (' + format(cells[t]['extra_params_total'], ',') + ')':>{width}}"
                         for t in tiers)
        print(f"{arm:<15} {'+'.join(some['slots']) or '-':<20} {shown}  {some['description']}")
