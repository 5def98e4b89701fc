"""A small load test for ``specdec serve`` (or any OpenAI-compatible server).

    python -m specdec.server.loadtest --base-url http://127.0.0.1:8000/v1 \\
        --clients 32 --requests 64 --max-tokens 32

``--clients`` concurrent clients send ``--requests`` requests in all (greedy, streamed, each
with a different prompt) and the run reports requests/s, generated tokens/s, and latency and
time-to-first-token percentiles. The model defaults to the first one ``/v1/models`` lists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

TOPICS = [
    "the ocean",
    "a lighthouse keeper",
    "bread baking",
    "the moon landing",
    "a lost cat",
    "volcanoes",
    "a chess match",
    "autumn leaves",
    "a robot learning to paint",
    "the history of tea",
    "a mountain village",
    "honeybees",
    "a train journey",
    "the first computer",
    "a rainy afternoon",
    "desert stars",
]
STYLES = ["Write a short story about", "Explain to a child", "Describe", "List three facts about"]


def prompt_for(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    style = STYLES[(i // len(TOPICS)) % len(STYLES)]
    return f"{style} {topic}." + (f" (request {i})" if i >= len(TOPICS) * len(STYLES) else "")


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def run(args) -> dict:
    import openai

    client = openai.AsyncOpenAI(
        base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout
    )
    model = args.model or (await client.models.list()).data[0].id
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.requests):
        todo.put_nowait(i)
    results: list[dict] = []
    errors: list[str] = []

    async def one(i: int) -> dict:
        t0 = time.perf_counter()
        ttft = None
        tokens = 0
        kw = dict(
            model=model,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            stream=True,
            stream_options={"include_usage": True},
        )
        if args.ignore_eos:  # specdec extension: every request generates max_tokens
            kw["extra_body"] = {"ignore_eos": True}
        if args.chat:
            stream = await client.chat.completions.create(
                messages=[{"role": "user", "content": prompt_for(i)}], **kw
            )
        else:
            stream = await client.completions.create(prompt=prompt_for(i), **kw)
        async for chunk in stream:
            if chunk.choices and ttft is None:
                c = chunk.choices[0]
                piece = c.delta.content if args.chat else c.text
                if piece:
                    ttft = time.perf_counter() - t0
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return {"latency": time.perf_counter() - t0, "ttft": ttft, "tokens": tokens}

    async def worker():
        while True:
            try:
                i = todo.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                results.append(await one(i))
            except Exception as exc:  # noqa: BLE001 - count it and go on
                errors.append(f"{type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.clients)))
    wall = time.perf_counter() - t0
    await client.close()
    lat = [r["latency"] for r in results]
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in results)
    return {
        "model": model,
        "clients": args.clients,
        "requests": args.requests,
        "completed": len(results),
        "errors": len(errors),
        "first_errors": errors[:3],
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "latency_p50_s": percentile(lat, 0.5),
        "latency_p90_s": percentile(lat, 0.9),
        "latency_p99_s": percentile(lat, 0.99),
        "latency_mean_s": statistics.fmean(lat) if lat else float("nan"),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p99_s": percentile(ttft, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.server.loadtest", description=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default=None, help="default: the first model /v1/models lists")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    r = asyncio.run(run(args))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(
            f"{r['completed']}/{r['requests']} requests ({r['errors']} errors) from "
            f"{r['clients']} clients in {r['wall_s']:.1f} s: {r['requests_per_s']:.2f} req/s, "
            f"{r['tokens_per_s']:.1f} generated tokens/s\n"
            f"latency p50 {r['latency_p50_s']:.2f} s, p90 {r['latency_p90_s']:.2f} s, "
            f"p99 {r['latency_p99_s']:.2f} s; first token p50 {r['ttft_p50_s']:.2f} s, "
            f"p99 {r['ttft_p99_s']:.2f} s"
        )
        for e in r["first_errors"]:
            print("error:", e, file=sys.stderr)
    return 0 if r["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
