"""The ``pagedq`` command line."""

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedq.logs import configure_logging

if TYPE_CHECKING:
    from core.settings import Settings

from contract.engine import DEFAULT_MODEL


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(os.environ.get("PAGEDQ_LOG_LEVEL", "INFO"), os.environ.get("PAGEDQ_LOG_FORMAT", "auto"))
    return args.func(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedq", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="generate text for prompts with the engine, offline")
    generate.add_argument("prompts", nargs="+", help="one or more prompts")
    generate.add_argument(
        "--model",
        help=f"a Hugging Face directory, a .gguf file or the built-in {DEFAULT_MODEL}; default: "
        "$PAGEDQ_MODEL or that",
    )
    generate.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, help="default: the model's (generation_config.json)")
    generate.add_argument("--top-p", type=float, help="default: the model's (generation_config.json)")
    generate.add_argument("--seed", type=int)
    generate.add_argument("--device", help="default: $PAGEDQ_DEVICE or the engine's (auto)")
    generate.add_argument("--dtype", help="default: $PAGEDQ_DTYPE or the engine's (auto)")
    generate.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    generate.set_defaults(func=run_generate)

    model = commands.add_parser("fetch-model", help="build the default model's Hugging Face directory once")
    model.set_defaults(func=run_fetch_model)

    up = commands.add_parser("up", help="API, worker and webhook sender on SQLite and a local broker")
    api = commands.add_parser("api", help="serve the REST API")
    for serving in (up, api):
        serving.add_argument("--host", help="default: $PAGEDQ_HOST or 127.0.0.1")
        serving.add_argument("--port", type=int, help="default: $PAGEDQ_PORT or 8000")
    up.set_defaults(func=run_service, service="up")
    api.set_defaults(func=run_service, service="api")
    worker = commands.add_parser("worker", help="run one engine that drains its model's queue")
    worker.add_argument(
        "--check",
        action="store_true",
        help="do not run: print the running worker's health from its status file "
        "($PAGEDQ_WORKER_STATUS_FILE) "
        "and exit 0 if it is healthy, 1 if not (a healthcheck)",
    )
    worker.add_argument(
        "--model", help="the served model whose queue it drains (default: the first generate model)"
    )
    worker.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # `pagedq up` hears of readiness
    worker.set_defaults(func=run_service, service="worker")
    webhooks = commands.add_parser("webhooks", help="send webhooks: signed, retried, recorded")
    webhooks.set_defaults(func=run_service, service="webhooks")
    migrate = commands.add_parser("migrate", help="bring the database schema to the latest revision")
    migrate.set_defaults(func=run_service, service="migrate")

    keys = commands.add_parser(
        "keys", help="make, list and revoke API keys (in the database of the settings)"
    )
    key_actions = keys.add_subparsers(required=True, metavar="ACTION", dest="action")
    create = key_actions.add_parser("create", help="make a key and print it (the only time it is shown)")
    create.add_argument("--name", required=True)
    create.add_argument("--admin", action="store_true", help="an admin key: every object, /v1/admin/keys")
    create.add_argument("--expires-in", help="30d, 12h, 90m or 45s; default: never")
    key_actions.add_parser("list", help="list keys (their first characters, never the keys)")
    revoke = key_actions.add_parser("revoke", help="revoke a key: its requests get 403 from now on")
    revoke.add_argument("key", metavar="NAME|ID")
    keys.set_defaults(func=run_keys)

    submit = commands.add_parser("submit", help="submit a JSONL file of jobs, one POST /v1/jobs body a line")
    submit.add_argument("file", type=Path, help="one JSON object a line; blank lines are skipped")
    submit.add_argument("--wait", action="store_true", help="wait for every job and write its result")
    submit.add_argument("--out", type=Path, help="write the JSONL (ids, or results with --wait) here")
    submit.add_argument("--concurrency", type=positive, default=16, help="requests in flight at once")
    submit.add_argument(
        "--new",
        action="store_true",
        help="run every line again: without it, re-submitting a file returns the jobs it made before",
    )
    submit.add_argument(
        "--batch",
        action="store_true",
        help="the file holds OpenAI batch request lines: run it as one batch (POST /v1/batches), wait, "
        "and write every line's result in input order",
    )
    submit.add_argument(
        "--endpoint", choices=BATCH_ENDPOINTS, default=BATCH_ENDPOINTS[0], help="with --batch"
    )
    submit.set_defaults(func=run_submit)
    jobs = commands.add_parser("jobs", help="read, list and cancel jobs")
    actions = jobs.add_subparsers(required=True, metavar="ACTION", dest="action")
    get = actions.add_parser("get", help="print a job as JSON")
    cancel = actions.add_parser("cancel", help="cancel a queued or running job")
    for one in (get, cancel):
        one.add_argument("id")
    listing = actions.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--status", action="append", choices=STATUSES, help="repeat for several")
    listing.add_argument("--limit", type=positive, default=20)
    listing.add_argument("--after", help="the cursor a previous page printed")
    listing.add_argument("--json", action="store_true", help="print one JSON object per job")
    jobs.set_defaults(func=run_jobs)
    for client in (submit, get, cancel, listing):
        client.add_argument(
            "--url", help="the API; default: $PAGEDQ_API_URL, else http://$PAGEDQ_HOST:$PAGEDQ_PORT"
        )
    return parser


STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"]
BATCH_ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line (an option left out is None)."""
    return {name: value for name, value in options.items() if value is not None}


def run_generate(args: argparse.Namespace) -> int:
    from core.settings import Settings
    from worker.engine import LLM

    engine = {"model": args.model, "device": args.device, "dtype": args.dtype}
    settings = Settings()
    knobs = asdict(settings.engine_config())
    if "quantization" not in settings.model_fields_set:
        del knobs["quantization"]  # the model's default: a .gguf file's weights in their own types
    llm = LLM(**knobs | given(engine))
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    params = llm.sampling_params(max_tokens=args.max_tokens, **given(sampling))
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


def run_service(args: argparse.Namespace) -> int:
    from core.settings import Settings
    from pagedq import serve, up

    overrides = {k: v for k in ("host", "port") if (v := getattr(args, k, None)) is not None}
    settings = Settings(**overrides)
    if getattr(args, "check", False):
        return check_worker(settings)
    services = {
        "up": up.up,
        "api": serve.serve_api,
        "worker": lambda settings: serve.serve_worker(settings, args.ready_fd, args.model),
        "webhooks": serve.serve_webhooks,
        "migrate": serve.migrate,
    }
    return services[args.service](settings) or 0


def check_worker(settings: "Settings") -> int:
    from worker.health import check

    healthy, line = check(settings.resolved_worker_status_file, stale_after=settings.heartbeat_timeout)
    print(line)
    return 0 if healthy else 1


def run_keys(args: argparse.Namespace) -> int:
    from core.settings import Settings
    from pagedq.keys import manage_keys

    return manage_keys(Settings(), args.action, args)


def run_submit(args: argparse.Namespace) -> int:
    from pagedq.client import submit_file

    if args.batch:
        from pagedq.batch import submit_batch

        return submit_batch(args.file, api_url(args), endpoint=args.endpoint, out=args.out)
    return submit_file(
        args.file, api_url(args), wait=args.wait, out=args.out, concurrency=args.concurrency, new=args.new
    )


def run_jobs(args: argparse.Namespace) -> int:
    from pagedq import client

    if args.action == "list":
        return client.list_jobs(api_url(args), args.status or [], args.limit, args.after, args.json)
    return {"get": client.get_job, "cancel": client.cancel_job}[args.action](api_url(args), args.id)


def api_url(args: argparse.Namespace) -> str:
    from core.settings import Settings

    return args.url or Settings().resolved_api_url
