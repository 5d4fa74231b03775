"""Serving: the OpenAI-compatible HTTP server (`radixkv serve`) over an engine core in its own process.

- async_engine.py: AsyncLLM, the front end: validated requests in (engine/inputs.py), each step's tokens
  out as text deltas and stop strings (engine/outputs.py) to every request's stream.
- core_proc.py: the engine-core process (`core_main`) and the API side's client of it (ProcessCore);
  inproc.py: the same core on a thread beside an LLM built in Python (InprocCore); core_loop.py: what the
  core side does with each message and step (both); wire.py: the messages between the two processes.
- streams.py: what a caller holds (RequestStream, StreamOutput) and the engine's errors;
  loglines.py: the periodic throughput line.
- protocol.py: the OpenAI request bodies (pydantic, validated) and the error object; structured_fields.py:
  every spelling of structured outputs and tool choice -> one constraint; tool_calls.py: tool-call parsers.
- metrics.py: Prometheus series (vLLM's names under a `radixkv:` prefix), from the core's EngineStats.
- app.py: the FastAPI app and its routes; handlers.py: the two generation endpoints (responses.py: envelopes,
  SSE events, usage, logprobs; token_bytes.py: a token's bytes and name; api_errors.py: the error object;
  routes_extra.py: /tokenize, /detokenize, /version); cli_serve.py:
  the `radixkv serve` subcommand; bench_client.py, bench_datasets.py, bench_results.py, cli_bench.py: `radixkv bench-serve`.

Importing this package loads neither torch nor FastAPI; the modules do.
"""
