"""Downstream evaluation of trained runs through EleutherAI's lm-evaluation-harness (`lm-eval`).

Why the harness and not a hand-written evaluator: papers quote the harness's numbers, and its
prompts, answer normalisations and metrics differ in small ways from any re-implementation.

* `ablate.evals.lm`: `AblateLM`, the harness's model interface over ablate's GPT (torch).
* `ablate.evals.tasks`: the supported tasks and their local JSON-lines data (`--task-data`).
* `ablate.evals.run`: `evaluate_run` (one run folder → `eval.json`) and `EvalJob` (a submitit task).
* `ablate.evals.results`: reading `eval.json` (torch-free, for the analysis).
* `ablate.evals.items`: the per-item results RUN_DIR/eval_items/<task>.jsonl (torch-free, for the analysis).
* `ablate.cli.evals`: `ablate eval`.

`lm-eval` is an optional extra (`pip install -e '.[eval]'`): nothing here imports it at import time.
"""

