"""32 concurrent streaming clients with shared prefixes: all complete, greedy outputs equal offline
generate, the prefix cache hits, and no page leaks once they finish (loopback only, bounded)."""
from __future__ import annotations

import asyncio
import json

import httpx

from .conftest import offline

CLIENTS = 32
SYSTEM = [60 + (i % 40) for i in range(40)]  # a 40-token shared prefix (2 full pages)


def test_32_concurrent_streams(server) -> None:
    prompts = [SYSTEM + [110 + i % 8, 120 + i] for i in range(CLIENTS)]
    want = {i: offline(server, p, 4, ignore_eos=True).token_ids for i, p in enumerate(prompts) if i < 8}
    server.engine.call(lambda llm: llm.reset_prefix_cache()).result(30)

    async def one(client: httpx.AsyncClient, i: int) -> list[int]:
        body = {"prompt": prompts[i], "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        tokens: list[int] = []
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    tokens += json.loads(line[6:])["choices"][0]["token_ids"]
        return tokens

    async def run() -> list[list[int]]:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(CLIENTS))), 60)

    got = asyncio.run(run())
    assert all(len(t) == 4 for t in got)
    assert all(got[i] == w for i, w in want.items())
    hits = server.engine.call(lambda llm: llm.core.scheduler.metrics.hit_tokens).result(30)
    assert hits > 0
    text = httpx.get(f"{server.url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("radixkv:prefix_cache_hits_total{"))
    assert float(line.split()[-1]) > 0
    assert server.pool_whole()  # 0 leaked pages
