"""`ablate arms`: every registered arm with its slot(s), extra parameters per layer and a description.

Given an experiment (name or file), the file is loaded first, so arms it registers are known, and the
table lists the experiment's arms.
"""

from __future__ import annotations


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("arms", help="list the registered attention arms (or an experiment's arms)")
    parser.add_argument("experiment", nargs="?",
                        help="an experiments/*.py file or its name: load it (registering its arms) and list its arms")
    parser.add_argument("--d-model", type=int, default=768, help="width used to count parameters (default 768)")
    parser.add_argument("--n-head", type=int, default=12, help="heads used to count parameters (default 12)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_arms)


def arm_table(d_model: int = 768, n_head: int = 12, arms: list[str] | None = None) -> list[dict]:
    """One row per arm (default: every registered arm); parameter counts are measured on a real 1-layer
    model of that width."""
    from ablate.arms import get_arm, list_arms
    from ablate.model import GPT, GPTConfig

    rows = []
    for name in list_arms() if arms is None else arms:
        cls = get_arm(name)
        model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=n_head, d_model=d_model, max_seq_len=8, arm=name))
        extra = model.param_counts()["arm_extra"]
        rows.append({
            "arm": name,
            "slots": list(cls.slots()) or (["sequence"] if cls.sequence_token else []),
            "extra_params_per_layer": 0 if cls.sequence_token else extra,
            "extra_params_once": extra if cls.sequence_token else 0,
            "description": cls.description,
        })
    return rows


def _arms(args) -> int:
    import json

    arms = None
    if args.experiment:
        from ablate.experiment import load_experiment

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
