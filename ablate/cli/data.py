"""`ablate data prepare`, `ablate data info` and `ablate data build-sample`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _source_arg(text: str) -> tuple[str, object]:
    """`KEY=VALUE` for a source's own arguments; VALUE is read as JSON when it parses, else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


def _count(text: str) -> int:
    """Token counts may be written 2e8 or 200_000_000."""
    value = float(text.replace("_", ""))
    if value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {text!r}")
    return int(value)


def add_commands(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare and inspect token shards")
    commands = data.add_subparsers(dest="data_command", metavar="COMMAND")
    data.set_defaults(func=lambda args: data.print_help() or 2)

    prep = commands.add_parser(
        "prepare",
        help="tokenize a corpus into uint16 shards with a manifest",
        description="Tokenize a corpus (GPT-2 BPE) into uint16 shards plus manifest.json. Interrupted runs "
        "resume when rerun with the same arguments; a finished folder is left as it is.",
    )
    prep.add_argument("--source", required=True, help="fineweb-edu, parquet, jsonl, sample (or a registered source)")
    prep.add_argument("--out", required=True, help="output folder")
    prep.add_argument("--tokens", type=_count, help="training-token budget (default: the whole source)")
    prep.add_argument("--shard-tokens", type=_count, help="tokens per shard (default 1e8)")
    prep.add_argument("--val-fraction", type=float, help="share of documents held out, by id hash (default per source)")
    prep.add_argument("--val-tokens", type=_count, help="cap on validation tokens (default 1e7)")
    prep.add_argument("--workers", type=int, help="tokenizer processes (default: all CPUs); never changes the output")
    prep.add_argument("--config", help="fineweb-edu: dataset config (default sample-10BT)")
    prep.add_argument("--data-files", nargs="+", help="fineweb-edu: local parquet files instead of the hub")
    prep.add_argument("--path", nargs="+", help="parquet/jsonl: files, folders or globs")
    prep.add_argument("--text-column", help="parquet/jsonl: the column holding the text (default text)")
    prep.add_argument("--id-column", help="parquet/jsonl: a column of stable document ids (default: the text's hash)")
    prep.add_argument("--source-arg", nargs="+", action="extend", type=_source_arg, default=[], metavar="KEY=VALUE",
                      help="any other arguments of the source, space-separated (the option may be repeated)")
    prep.add_argument("--no-progress", action="store_true", help="no progress bar")
    prep.set_defaults(func=prepare_command)

    build = commands.add_parser("build-sample", help="rebuild the shipped sample (maintainers; needs pip "
                                                     "and the network)")
    build.add_argument("--wheel", type=Path, help="a downloaded gensim 4.4.0 wheel (default: pip download it)")
    build.add_argument("--out", type=Path, help="where to write the parquet file (default: the shipped one)")
    build.set_defaults(func=build_sample_command)

    info = commands.add_parser("info", help="summarise a prepared folder's manifest")
    info.add_argument("dir", help="a folder written by `ablate data prepare`")
    info.add_argument("--verify", action="store_true", help="also check every shard's SHA-256")
    info.set_defaults(func=info_command)


def prepare_command(args) -> int:
    import logging

    from ablate.data.writer import prepare

    options = {
        key: getattr(args, key)
        for key in ("tokens", "shard_tokens", "val_fraction", "val_tokens", "workers")
        if getattr(args, key) is not None
    }
    source_args = {
        key: getattr(args, key)
        for key in ("config", "data_files", "path", "text_column", "id_column")
        if getattr(args, key) is not None
    }
    source_args.update(dict(args.source_arg))
    out = prepare(args.source, args.out, progress_bar=not args.no_progress, **options, **source_args)
    logging.getLogger(__name__).info("done: %s (see `ablate data info %s`)", out, out)
    return 0


def info_command(args) -> int:
    from ablate.data.shards import TokenShards, read_manifest

    manifest = read_manifest(args.dir)
    lines = [
        f"folder      {args.dir}",
        f"source      {manifest['source']} {json.dumps(manifest['source_args'], sort_keys=True)}",
        f"tokenizer   {manifest['tokenizer']} (vocab {manifest['vocab_size']}, "
        f"sha256 {manifest['tokenizer_sha256'][:16]}…)",
        f"read        {manifest['documents_read']:,} documents",
    ]
    for split, facts in manifest["splits"].items():
        shards = TokenShards(args.dir, split, verify=args.verify)
        lines.append(
            f"{split:<11} {facts['tokens']:>15,} tokens  {facts['documents']:>10,} documents  "
            f"{len(facts['shards']):>5} shards  fingerprint {shards.fingerprint[:16]}…"
        )
    if args.verify:
        lines.append("checksums   every shard matches its manifest SHA-256")
    print("\n".join(lines))
    return 0


def build_sample_command(args) -> int:
    from ablate.data.sample import OUT, build_sample

    build_sample(args.wheel, args.out or OUT)
    return 0
