"""``specdec serve``: the OpenAI-compatible server (``specdec.server``) on uvicorn."""

from __future__ import annotations

import argparse
import logging
import os

from specdec.cli.args import add_engine_args, int_at_least, llm_from_args, positive_seconds
from specdec.server.connection import DEFAULT_HEADER_TIMEOUT_S
from specdec.server.guard import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("specdec.server")

MIN_MODEL_LEN = 64  # below this the server would be of no use: refuse to start
SERVE_MAX_NUM_SEQS = 16  # requests decoded together unless --max-num-seqs says otherwise


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_serve_args(s)
    s.set_defaults(func=serve)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)  # --max-model-len: by default capped so that the caches fit the KV budget
    p.set_defaults(max_num_seqs=SERVE_MAX_NUM_SEQS)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    g.add_argument("--port", type=int_at_least(0, 65535), default=8000)
    g.add_argument(
        "--api-key",
        default=os.environ.get("SPECDEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $SPECDEC_API_KEY; none: open)",
    )
    g.add_argument(
        "--max-waiting",
        type=int_at_least(0),
        default=64,
        help="queued requests beyond the batch (then 429)",
    )
    g.add_argument("--max-body-bytes", type=int_at_least(1), default=DEFAULT_MAX_BODY_BYTES)
    g.add_argument(
        "--header-timeout",
        type=positive_seconds,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a client has to send a request's headers (then the connection closes)",
    )
    g.add_argument(
        "--body-timeout",
        type=positive_seconds,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="seconds a client has to send a request's body after its headers (then 408)",
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _cap_model_len(llm, max_num_seqs: int) -> None:
    """Shorten ``llm.max_model_len`` so that ``max_num_seqs`` cache rows fit in RAM."""
    fit = llm.fitting_model_len(max_num_seqs)
    if fit < MIN_MODEL_LEN:
        raise ValueError(
            f"the KV cache for {max_num_seqs} requests does not fit in memory: "
            "lower --max-num-seqs or set --max-model-len"
        )
    if fit < llm.max_model_len:
        log.warning(
            "max_model_len capped at %d tokens so %d cache rows fit in RAM "
            "(set --max-model-len to choose)",
            fit,
            max_num_seqs,
        )
        llm.max_model_len = fit


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.server import create_app, http_protocol

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(message)s"
    )
    llm = llm_from_args(args)
    if args.max_model_len is None:
        _cap_model_len(llm, args.max_num_seqs)
    app = create_app(
        llm,
        args.model,
        api_key=args.api_key,
        max_num_seqs=args.max_num_seqs,
        max_model_len=llm.max_model_len,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning(
            "listening on %s without an API key: anyone who can reach it may use it",
            args.host,
        )
    print(f"specdec serve: http://{args.host}:{args.port}/v1 (model '{args.model}')", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        http=http_protocol(args.header_timeout),
    )
    llm.close()
    return 0
