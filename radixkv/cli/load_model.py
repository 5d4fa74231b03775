"""The engine as the CLI builds it: what `LLM` refuses becomes a one-line CliError."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixkv.cli.common import CliError, one_line, out_of_memory

if TYPE_CHECKING:  # the engine loads torch: only the engine commands and a real replay import it
    from radixkv.engine.llm import LLM


def build_engine(model: str, **config: Any) -> LLM:
    """`LLM(model, **config)`, with what the engine refuses (an unsupported architecture, a
    missing, corrupt or truncated model file, an unknown dtype, a device this torch lacks, a KV
    pool larger than memory) as a CliError."""
    from radixkv.engine.llm import LLM

    try:
        return LLM(model, **config)
    except (ValueError, TypeError, OSError, ImportError) as e:  # ImportError: a .gguf without gguf
        raise CliError(f"cannot load model {model}: {one_line(e)}") from None
    except (RuntimeError, MemoryError) as e:
        if not out_of_memory(e):
            raise
        raise CliError(f"cannot load model {model}: out of memory for its weights and a KV pool of "
                       f"{pool_words(config)} ({one_line(e)[:200]})") from None


def pool_words(config: dict[str, Any]) -> str:
    pages = config.get("num_pages")
    return (f"{pages:,} pages x {config.get('page_size', 16)} tokens; give a smaller --num-pages or --page-size"
            if pages else f"the default size at --page-size {config.get('page_size', 16)}")
