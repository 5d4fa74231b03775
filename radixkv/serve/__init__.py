"""Serving: the async engine loop and the OpenAI-compatible HTTP server (`radixkv serve`).

- async_engine.py: AsyncLLM, one background thread that owns an LLM and steps it (continuous
  batching); requests are added from any thread or coroutine and stream their deltas.
- detokenize.py: incremental detokenisation and stop strings of one request's stream.
- streams.py: what a caller holds (RequestStream, StreamOutput) and the engine's errors;
  loglines.py: the loop's periodic throughput line.
- protocol.py: the OpenAI request bodies (pydantic, validated) and the error object.
- metrics.py: Prometheus series (vLLM's names under a `radixkv:` prefix).
- app.py: the FastAPI app (responses.py: envelopes, SSE events, usage, logprobs); cli_serve.py:
  the `radixkv serve` subcommand.

Importing this package loads neither torch nor FastAPI; the modules do.
"""
