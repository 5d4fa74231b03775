"""`radixkv serve MODEL`: the OpenAI-compatible server on uvicorn, with vLLM's flag names.

`--config FILE.yaml` holds the same options as keys (`max-num-seqs: 64` or `max_num_seqs: 64`,
`model: ...` too); a flag given on the command line wins over the file. Self-contained: the
`radixkv` command adds it with `add_serve_parser(subparsers)`; `run_serve(args)` returns the exit
status.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from radixkv.argtypes import positive_int
from radixkv.config import check_load_format
from radixkv.plan_host import GIB, check_pinnable, parse_gb, parse_ratio

# option dest -> default (applied after the config file, so a flag left out can come from it)
DEFAULTS: dict[str, Any] = {
    "model": None, "host": "127.0.0.1", "port": 8000, "page_size": 16, "dtype": "auto", "kv_cache_dtype": "auto",
    "device": None, "gpu_memory_utilization": 0.9, "num_gpu_blocks_override": None, "max_model_len": None,
    "max_num_seqs": None, "max_num_batched_tokens": None, "enable_prefix_caching": True, "enforce_eager": False,
    "seed": 0, "tensor_parallel_size": 1, "api_key": None, "served_model_name": None, "disable_log_stats": False,
    "log_level": "info", "chat_template": None, "load_format": "auto", "enable_log_requests": False,
    "tool_call_parser": "hermes",
    "trust_request_chat_template": False, "metrics_require_key": False, "enable_reset_prefix_cache": False,
    "host_kv_cache_gb": None, "hicache_ratio": None,
}
# config-file spellings that differ from the dest
_ALIASES = {"block_size": "page_size", "block-size": "page_size"}


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return v


def _arg(parse: Any) -> Any:
    """An argparse type from a plan_host parser (its ValueError names the flag and the text)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return convert


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `serve` subcommand to an argparse subparsers object; sets `run=run_serve`."""
    s = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (completions, chat, SSE streaming, /metrics)",
        description="Serve MODEL over OpenAI's HTTP API: POST /v1/completions, /v1/chat/completions "
                    "(stream: true -> server-sent events), GET /v1/models, /health, /metrics (Prometheus), "
                    "POST /tokenize, /detokenize, GET /version (and POST /reset_prefix_cache with "
                    "--enable-reset-prefix-cache). `cache_salt` in a body isolates a tenant's prefix cache.")
    s.add_argument("model", nargs="?", metavar="MODEL",
                   help="Hugging Face folder, .gguf file, hub id in the local cache, or config.json (random weights)")
    s.add_argument("--config", metavar="FILE.yaml", help="YAML file of these options (flags given here win)")
    s.add_argument("--host", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default 8000)")
    s.add_argument("--block-size", "--page-size", dest="page_size", type=positive_int, metavar="N",
                   help="tokens per KV page (default 16)")
    s.add_argument("--dtype", help="compute dtype: auto, float32, bfloat16, float16 (default auto)")
    s.add_argument("--kv-cache-dtype", help="KV cache dtype: auto, fp32, bf16, fp16, fp8 (= fp8_e4m3), fp8_e5m2")
    s.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    s.add_argument("--gpu-memory-utilization", type=_fraction, metavar="F",
                   help="share of free GPU memory for weights + KV (default 0.9)")
    s.add_argument("--num-gpu-blocks-override", type=positive_int, metavar="N", help="KV pages, overriding the sizing")
    s.add_argument("--max-model-len", type=positive_int, metavar="N", help="prompt + output tokens per request")
    s.add_argument("--max-num-seqs", type=positive_int, metavar="N", help="requests running at once")
    s.add_argument("--max-num-batched-tokens", type=positive_int, metavar="N", help="tokens computed per step")
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share KV of common prompt prefixes (default on)")
    s.add_argument("--enforce-eager", action="store_true", default=None, help="never replay CUDA graphs")
    s.add_argument("--load-format", metavar="FORMAT",
                   help="how to load the weights: auto or dummy (random weights shaped by the folder's config.json, "
                        "with its tokenizer and chat template: benchmark a model without its weights; default auto)")
    s.add_argument("--seed", type=int, help="sampling seed stream / random weights (default 0)")
    s.add_argument("--tensor-parallel-size", "-tp", type=positive_int, metavar="N",
                   help="shard the model over N ranks (GPUs from --device on, or CPU processes; default 1)")
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/* (default: $RADIXKV_API_KEY)")
    s.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="model name(s) clients use (default: MODEL as given)")
    s.add_argument("--disable-log-stats", action="store_true", default=None,
                   help="no periodic throughput log line")
    s.add_argument("--chat-template", metavar="FILE_OR_STRING",
                   help="Jinja chat template for /v1/chat/completions and /tokenize: a file, or the template "
                        "itself (default: the tokenizer's)")
    s.add_argument("--tool-call-parser", choices=["hermes", "llama3_json"],
                   help="how tool_choice auto reads tool calls in the output (default hermes: <tool_call> JSON)")
    s.add_argument("--enable-log-requests", action="store_true", default=None,
                   help="log one line a request: its id, prompt length and sampling params (default off)")
    s.add_argument("--trust-request-chat-template", action="store_true", default=None,
                   help="accept a request's own `chat_template` (a template is code the server runs; "
                        "default: refused with 400)")
    s.add_argument("--metrics-require-key", action="store_true", default=None,
                   help="with --api-key, /metrics needs the key too (default: open for scrapers)")
    s.add_argument("--enable-reset-prefix-cache", action="store_true", default=None,
                   help="serve POST /reset_prefix_cache, with which a client flushes every tenant's prefix cache "
                        "(default: off, 404; vLLM serves it in its dev mode only)")
    s.add_argument("--host-kv-cache-gb", type=_arg(lambda t: parse_gb(t) / GIB), metavar="N",
                   help="a host-memory KV tier of N GiB under the GPU pool (pinned; GPU eviction writes blocks "
                        "back there, a prefix hit on them loads them back; default: none)")
    s.add_argument("--hicache-ratio", type=_arg(parse_ratio), metavar="R",
                   help="SGLang's spelling of the host tier: R host pages per GPU page (instead of --host-kv-cache-gb)")
    s.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                   help="log level (default info)")
    s.set_defaults(run=run_serve)
    return s


def load_config_file(path: str) -> dict[str, Any]:
    """The YAML file's options as {dest: value}; ValueError naming an unknown key."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml ships with transformers' usual installs
        raise ValueError("--config needs PyYAML (pip install pyyaml)") from None
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option: value, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        dest = _ALIASES.get(str(key), str(key).replace("-", "_"))
        if dest not in DEFAULTS:
            raise ValueError(f"{path}: unknown option {key!r}")
        out[dest] = value
    return out


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Every option: the flag, else the config file's value, else the default."""
    from_file = load_config_file(args.config) if getattr(args, "config", None) else {}
    opts = {}
    for dest, default in DEFAULTS.items():
        given = getattr(args, dest, None)
        opts[dest] = given if given is not None else from_file.get(dest, default)
    if opts["api_key"] is None:
        opts["api_key"] = os.environ.get("RADIXKV_API_KEY") or None
    elif not str(opts["api_key"]).strip():  # an empty key would silently turn authentication off
        raise ValueError("--api-key is empty; give a key, or leave the flag out to serve without one")
    if opts["metrics_require_key"] and opts["api_key"] is None:
        raise ValueError("--metrics-require-key needs an API key (--api-key or $RADIXKV_API_KEY)")
    if opts["model"] is None:
        raise ValueError("MODEL is required (as an argument or `model:` in --config)")
    check_load_format(opts["load_format"])  # a flag or a config-file value, refused before the model loads
    # the host tier: a config file's value is checked as a flag's is (refused before the model loads)
    if opts["host_kv_cache_gb"] is not None:
        opts["host_kv_cache_gb"] = gb = parse_gb(str(opts["host_kv_cache_gb"])) / GIB
        check_pinnable(int(gb * GIB), f"--host-kv-cache-gb {gb:g}")  # before the model loads, not after
    if opts["hicache_ratio"] is not None:
        opts["hicache_ratio"] = parse_ratio(str(opts["hicache_ratio"]))
    if opts["host_kv_cache_gb"] and opts["hicache_ratio"] is not None:
        raise ValueError("give --host-kv-cache-gb or --hicache-ratio, not both")
    return opts


def llm_kwargs(opts: dict[str, Any]) -> dict[str, Any]:
    """LLM(...) keyword arguments (vLLM's names) for the options that were set."""
    kw: dict[str, Any] = {"dtype": opts["dtype"], "block_size": opts["page_size"],
                          "kv_cache_dtype": opts["kv_cache_dtype"], "device": opts["device"],
                          "gpu_memory_utilization": opts["gpu_memory_utilization"],
                          "enable_prefix_caching": bool(opts["enable_prefix_caching"]),
                          "enforce_eager": bool(opts["enforce_eager"]), "seed": opts["seed"],
                          "tensor_parallel_size": int(opts["tensor_parallel_size"]),
                          "load_format": opts["load_format"]}
    for name in ("num_gpu_blocks_override", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if opts[name] is not None:
            kw[name] = opts[name]
    if opts.get("host_kv_cache_gb"):
        kw["host_kv_cache_bytes"] = int(opts["host_kv_cache_gb"] * GIB)
    if opts.get("hicache_ratio") is not None:
        kw["hicache_ratio"] = float(opts["hicache_ratio"])
    return kw


def load_chat_template(given: str) -> str:
    """--chat-template's value as a template: a file's text, else the string itself when it reads as a
    Jinja template (vLLM's rule); ValueError for a path that cannot be read or a template that does not parse."""
    if os.path.isfile(given):
        with open(given, encoding="utf-8") as f:
            template = f.read()
    elif any(c in given for c in "{}\n"):
        template = given
    else:
        raise ValueError(f"--chat-template {given!r}: no such file, and not a Jinja template")
    try:
        import jinja2

        jinja2.Environment().parse(template)
    except ImportError:  # pragma: no cover - transformers' chat templates need jinja2 anyway
        pass
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"--chat-template: the template does not parse: {err}") from None
    return template


def build_app(opts: dict[str, Any]) -> Any:
    """The FastAPI app for resolved options: starts the engine-core process (loads the model there)."""
    from .app import create_app
    from .async_engine import AsyncLLM
    from .metrics import ServeMetrics

    template = load_chat_template(str(opts["chat_template"])) if opts["chat_template"] else None
    names = opts["served_model_name"] or [str(opts["model"])]
    metrics = ServeMetrics(names[0])
    engine = AsyncLLM.start(opts["model"], stats=metrics, log_interval_s=None if opts["disable_log_stats"] else 10.0,
                            log_level=str(opts["log_level"]), **llm_kwargs(opts))
    if template is not None:
        if engine.tokenizer is None:
            engine.shutdown()
            raise ValueError("--chat-template: the model has no tokenizer to apply it with")
        engine.tokenizer.chat_template = template  # the API process's tokenizer: chat and /tokenize read it
    return create_app(None, served_model_name=names, api_key=opts["api_key"], engine=engine, metrics=metrics,
                      log_requests=bool(opts["enable_log_requests"]), tool_call_parser=str(opts["tool_call_parser"]),
                      trust_request_chat_template=bool(opts["trust_request_chat_template"]),
                      metrics_require_key=bool(opts["metrics_require_key"]),
                      enable_reset_prefix_cache=bool(opts["enable_reset_prefix_cache"]))


def run_serve(args: argparse.Namespace) -> int:
    """Load the model and serve until interrupted; the exit status (2: bad options or model)."""
    try:
        opts = resolve_options(args)
    except (OSError, ValueError) as err:
        print(f"radixkv: error: {err}", file=sys.stderr)
        return 2
    level = str(opts["log_level"]).upper()
    logging.basicConfig(level=level, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        import uvicorn
    except ImportError:
        print("radixkv: error: `radixkv serve` needs the serve extra: pip install 'radixkv[serve]'", file=sys.stderr)
        return 2
    try:
        app = build_app(opts)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        print(f"radixkv: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    logging.getLogger("radixkv.serve").info("serving %s on http://%s:%s", opts["model"], opts["host"], opts["port"])
    uvicorn.run(app, host=opts["host"], port=int(opts["port"]), log_level=opts["log_level"])
    return 0
