"""`ablate arms`: every registered arm with its slot(s) and hook(s), extra parameters per layer, its training path
(fused SDPA, or the reference path on a CPU and flex_attention on CUDA) and a description.

`ablate arms --check NAME [--arm-file FILE.py]` runs the check every registered arm is held to (`ablate.armcheck`:
fused = reference in float64, values and every gradient; causal on every path; KV-cache decoding = the full
forward, or refused in one line) on one arm, a user's included, and prints what holds, what was refused (not
checked) and what fails; it exits 1 when any check fails.

Given an experiment (name or file), the file is loaded first, so arms it registers are known, and the
table lists the experiment's arms with their parameters counted at each of its tiers (their width and
heads, with the experiment's model overrides); `--d-model/--n-head` count at one given width instead.
"""

from __future__ import annotations

import json
from pathlib import Path


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
    parser.add_argument("--check", metavar="NAME", help="run the check every arm is held to on arm NAME (float64: "
                                                        "fused = reference, values and gradients; decoding = the full "
                                                        "forward or refused) and print what holds")
    parser.add_argument("--arm-file", metavar="FILE.py", help="a Python file that registers your arm(s) "
                                                             "(`@register_arm(\"my-arm\")`), loaded first")
    parser.set_defaults(func=arms_command)


def load_arm_file(spec: str) -> Path:
    """The arm file, loaded (its arms registered) the way an experiment file is: its folder on the import path
    while it loads; a path that is no .py file is one clear line. `arms`, `run` and `testbed` take it."""
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli
    from ablate.experiment import load_module

    path = Path(spec)
    if path.suffix != ".py" or not path.is_file():
        raise AblateError(f"--arm-file {spec!r} is not a Python file; give the path of a .py file that registers "
                          "your arm (`@register_arm(\"my-arm\")`)")
    load_module(path.resolve())
    return path.resolve()


def check_command(name: str, as_json: bool) -> int:
    from ablate.armcheck import check_arm  # the library loads in the handler: see ablate.cli
    from ablate.arms import get_arm

    cls = get_arm(name)
    results = check_arm(name)
    if as_json:
        print(json.dumps([{"check": r.check, "status": r.status, "detail": r.detail} for r in results], indent=2))
    else:
        print(f"arm {name}: slots {'+'.join(cls.slots()) or '-'}, hooks {'+'.join(cls.hooks()) or '-'}, path "
              f"{cls.path('cpu')} on a CPU, {cls.path('cuda')} on CUDA")
        for r in results:
            print(f"  {r.status:<8} {r.check}: {r.detail}")
        print(check_tally(results))
    return 0 if all(r.ok for r in results) else 1


def check_tally(results) -> str:
    """The last line of `arms --check`: how many checks hold, were refused (not checked: never a reason to call the
    arm sound) or do not apply, and how many fail (a causality leak among them)."""
    count = {status: [r.check.split(":")[0] for r in results if r.status == status]
             for status in ("holds", "refused", "not run", "fails")}
    refused = f" ({', '.join(count['refused'])}: not checked)" if count["refused"] else ""
    failed = f" ({', '.join(count['fails'])})" if count["fails"] else ""
    return (f"{len(count['holds'])} of {len(results)} checks hold; {len(count['refused'])} refused{refused}; "
            f"{len(count['not run'])} do not apply; {len(count['fails'])} fail{failed}")


def arms_command(args) -> int:
    from ablate.experiment import load_experiment  # the library loads in the handler: see ablate.cli
    from ablate.sizing import arm_table

    if args.arm_file:
        load_arm_file(args.arm_file)
    if args.check:
        return check_command(args.check, args.json)
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
    print(f"{'arm':<15} {'slot(s)/hook(s)':<20} {'extra/layer':>11}  {'path CPU/CUDA':<16} description")
    for row in rows:
        print(f"{row['arm']:<15} {_filled(row):<20} {_extra(row):>11}  {_path(row):<16} {row['description']}")
    return 0


def _filled(row: dict) -> str:
    return "+".join(row["slots"] + row["hooks"]) or "-"


def _path(row: dict) -> str:
    """'fused', or 'reference/flex': the reference path on a CPU, compiled flex_attention on CUDA."""
    cpu, cuda = row["path"]["cpu"], row["path"]["cuda"]
    return cpu if cpu == cuda else f"{cpu}/{cuda}"


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
    print(f"{'arm':<15} {'slot(s)/hook(s)':<20} " + " ".join(f"{t:>{width}}" for t in tiers)
          + f"  {'path CPU/CUDA':<16} description")
    by_arm: dict[str, dict] = {}
    for row in rows:
        by_arm.setdefault(row["arm"], {})[row["tier"]] = row
    for arm, cells in by_arm.items():
        some = next(iter(cells.values()))
        shown = " ".join(f"{_extra(cells[t]) + ' (' + format(cells[t]['extra_params_total'], ',') + ')':>{width}}"
                         for t in tiers)
        print(f"{arm:<15} {_filled(some):<20} {shown}  {_path(some):<16} {some['description']}")
