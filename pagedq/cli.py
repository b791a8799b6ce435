"""The ``pagedq`` command line."""

import argparse
import json
import logging
import os
import sys

from pythonjsonlogger.json import JsonFormatter


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(os.environ.get("PAGEDQ_LOG_LEVEL", "INFO"))
    return args.func(args)


def configure_logging(level: str) -> None:
    """JSON lines on stderr, one object per record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter("{asctime}{levelname}{name}{message}", style="{"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedq", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="generate text for prompts with the engine, offline")
    generate.add_argument("prompts", nargs="+", help="one or more prompts")
    generate.add_argument(
        "--model",
        default=os.environ.get("PAGEDQ_MODEL", "smollm2-135m-instruct"),
        help="a local Hugging Face directory, or the built-in smollm2-135m-instruct",
    )
    generate.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--device", default="auto")
    generate.add_argument("--dtype", default="auto")
    generate.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    generate.set_defaults(func=run_generate)

    model = commands.add_parser("fetch-model", help="build the default model's Hugging Face directory once")
    model.set_defaults(func=run_fetch_model)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    from worker.engine import LLM, SamplingParams

    llm = LLM(args.model, device=args.device, dtype=args.dtype)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params, use_tqdm=True)
    else:
        outputs = llm.generate(args.prompts, params, use_tqdm=True)
    for prompt, out in zip(args.prompts, outputs, strict=True):
        sample, metrics = out.outputs[0], out.metrics
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": sample.text,
                        "finish_reason": sample.finish_reason,
                        "completion_tokens": len(sample.token_ids),
                    }
                )
            )
        else:
            elapsed = (metrics.finished_time or 0.0) - metrics.arrival_time
            print(
                f"### {prompt}\n{sample.text}\n[{len(sample.token_ids)} tokens, {sample.finish_reason}, "
                f"{elapsed:.2f}s]\n"
            )
    return 0


def run_fetch_model(args: argparse.Namespace) -> int:
    from worker.engine.default_model import ensure_default_model

    print(ensure_default_model())
    return 0
