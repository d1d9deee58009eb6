"""`ablate generate RUN_DIR --prompt TEXT --tokens N`: decode from a trained corpus run's final weights."""

from __future__ import annotations


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="decode text from a trained corpus run (greedy, or seeded sampling)",
        description="Continue a prompt with a trained corpus run's final weights, token by token through the KV cache "
                    "(GPT-2 tokens). Greedy by default; --temperature T > 0 samples, reproducibly for a --seed. A task "
                    "tier's run, and an arm a KV cache cannot decode, are refused in one line.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder RESULTS/<experiment>/<tier>/<arm>/seed<k>")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens to decode (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); > 0: sample")
    parser.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default 0)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.set_defaults(func=generate_command)


def generate_command(args) -> int:
    from ablate.data import decode  # the library loads in the handler: see ablate.cli
    from ablate.modelio import default_device, generate_from_run

    _, new = generate_from_run(args.run_dir, args.prompt, args.tokens, args.temperature, args.seed,
                               args.device or default_device())
    print(args.prompt + decode(new))
    return 0
