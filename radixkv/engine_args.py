"""EngineArgs: LLM(...)'s options under vLLM's names, for scripts ported from vLLM's examples. No torch.

vLLM's offline examples build the engine from a command line:

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)            # --model, --dtype, --max-num-seqs, ...
    args = vars(parser.parse_args())
    llm = LLM(**args)                          # or LLM(**dataclasses.asdict(EngineArgs.from_cli_args(ns)))

Flags left out do not appear in the namespace (argparse.SUPPRESS), so LLM's own defaults apply; a
field left None in an EngineArgs means the same. LLM(...) takes every field below by keyword.
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, fields
from typing import Any

# the fields whose None means "LLM's default" (LLM(...) drops them)
NONE_IS_DEFAULT = ("tokenizer", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                   "num_gpu_blocks_override", "quantization", "device", "gpu_memory_utilization",
                   "enable_prefix_caching", "enforce_eager", "seed", "block_size", "kv_cache_dtype", "dtype",
                   "tensor_parallel_size", "load_format")


@dataclass
class EngineArgs:
    """The engine's options (module docstring); the same meaning as LLM(...)'s keywords of these names."""

    model: str
    tokenizer: str | None = None  # a folder whose tokenizer replaces the model's
    dtype: str | None = None  # auto, float32, bfloat16, float16
    kv_cache_dtype: str | None = None  # auto, fp32, bf16, fp16, fp8 / fp8_e4m3, fp8_e5m2, int4, int2
    block_size: int | None = None  # tokens per KV page (16)
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    seed: int | None = None
    tensor_parallel_size: int | None = None
    load_format: str | None = None  # auto or dummy
    device: str | None = None
    trust_remote_code: bool = False  # True is refused: radixkv runs its own model code only
    quantization: str | None = None  # only None: weights load as float

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add --model and one --kebab-case flag a field to parser (flags left out stay out of the namespace)."""
        group = parser.add_argument_group("engine (radixkv.EngineArgs)")
        for f in fields(EngineArgs):
            flag = "--" + f.name.replace("_", "-")
            kind = str(f.type).split(" |")[0]
            if kind == "bool":
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
            else:
                group.add_argument(flag, type={"int": int, "float": float}.get(kind, str), default=argparse.SUPPRESS,
                                   required=f.default is MISSING and f.name != "model")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def vllm_port_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """LLM(...)'s keywords with vLLM's port-only ones settled: None where it means the default dropped,
    trust_remote_code and quantization refused by name unless neutral. `tokenizer` stays (LLM loads it)."""
    out = {k: v for k, v in kwargs.items() if not (v is None and k in NONE_IS_DEFAULT)}
    if out.pop("trust_remote_code", False):
        raise ValueError("trust_remote_code=True is not supported: radixkv runs its own Llama-family model code, "
                         "never a checkpoint's")
    q = out.pop("quantization", None)
    if q is not None:
        raise ValueError(f"quantization={q!r} is not supported: weights load as float (a GGUF file is dequantised); "
                         f"to store the KV cache in fewer bits use kv_cache_dtype (fp8, int4, int2)")
    return out
