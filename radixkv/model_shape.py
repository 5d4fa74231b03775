"""A model's architecture numbers (ModelShape) read from a config.json, a .gguf or the local Hugging Face
cache, with bounds that refuse a file no model has: what `radixkv plan` and the KV arithmetic
(radixkv/plan.py) take. No torch; nothing is downloaded."""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from radixkv.config import DTYPE_ALIASES, KVDtype
from radixkv.files import MiB, UnreadableFile, check_regular, read_text_bounded
from radixkv.plan import DTYPE_BYTES, kv_bytes_per_token

MAX_CONFIG_BYTES = 16 * MiB  # a config.json is a few KiB; a larger one is not a config
# the largest value of a config size plan believes (far past any model: Llama 3.1 405B has 126 layers,
# hidden 16,384, 128 heads, intermediate 53,248, vocab 128,256)
MAX_CONFIG_SIZE = 1 << 20
MAX_CONFIG_FIELD = {"vocab_size": (1 << 31) - 1, "intermediate_size": 1 << 24, "hidden_size": 1 << 24}


def _short(v: Any) -> str:
    """repr(v), an integer of many digits by its length."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**12:
        return f"a {len(str(abs(v)))}-digit integer"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the arithmetic needs (Llama family)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str  # the checkpoint's, when it says (else bfloat16)

    @classmethod
    def from_config(cls, d: dict[str, Any], name: str) -> "ModelShape":
        """From a Hugging Face config.json dict; raises ValueError naming a missing or bad field: each size a
        positive integer of at most its bound (MAX_CONFIG_FIELD), KV heads dividing the heads, the heads
        the hidden size (without head_dim), a known weight dtype."""
        def need(key: str, value: Any = None, *, default: int | None = None) -> int:
            v = d.get(key) if value is None else value
            if v is None and default is not None:
                return default
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: config field {key!r} must be a positive integer, got {_short(v)}")
            bound = MAX_CONFIG_FIELD.get(key, MAX_CONFIG_SIZE)
            if v > bound:
                raise ValueError(f"{name}: config field {key!r} is {_short(v)}, more than any model has "
                                 f"(at most {bound:,})")
            return v
        heads = need("num_attention_heads")
        kv = need("num_key_value_heads", default=heads)
        if kv > heads or heads % kv:
            raise ValueError(f"{name}: num_key_value_heads {kv} must divide num_attention_heads {heads} "
                             f"(each KV head serves a whole group of query heads)")
        hidden = need("hidden_size")
        if d.get("head_dim") is None and hidden % heads:
            raise ValueError(f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                             f"(and no head_dim is given)")
        head_dim = need("head_dim", default=hidden // heads)
        raw = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        dtype = DTYPE_ALIASES.get(raw, raw) if isinstance(raw, str) else raw
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{name}: config field 'torch_dtype' {_short(raw)} is not a weight dtype "
                             f"plan knows ({', '.join(DTYPE_BYTES)})")
        return cls(name, need("num_hidden_layers"), hidden, heads, kv, head_dim,
                   need("intermediate_size"), need("vocab_size"), bool(d.get("tie_word_embeddings", False)), dtype)

    @property
    def num_params(self) -> int:
        """Weights: embedding, per layer q/k/v/o, gate/up/down and two norms, the final norm, the LM head."""
        H, D = self.hidden_size, self.head_dim
        attn = H * D * (2 * self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * H * self.intermediate_size + 2 * H
        head = 0 if self.tie_word_embeddings else self.vocab_size * H
        return self.vocab_size * H + self.num_layers * layer + H + head

    def kv_bytes_per_token(self, kv_dtype: str | KVDtype) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype)


def read_model_shape(model: str) -> ModelShape:
    """A folder with config.json, a config.json, a .gguf file, or a hub id in the local Hugging Face
    cache (never downloaded). Raises ValueError naming the file when it cannot be read."""
    if model.endswith(".gguf"):
        return _gguf_shape(model)
    path = model
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
    elif not os.path.exists(model) and re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        path = _cached_config(model)
    try:
        d = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, "config.json"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (MODEL is a folder, a config.json, a .gguf or a cached hub id)") from None
    except UnreadableFile:  # a FIFO, a device, a config of more than MAX_CONFIG_BYTES
        raise
    except RecursionError:
        raise ValueError(f"{path}: not a readable JSON config: nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # (json.JSONDecodeError is a ValueError)
        raise ValueError(f"{path}: not a readable JSON config: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a config is a JSON object, got {type(d).__name__}")
    return ModelShape.from_config(d, path)


def _cached_config(repo_id: str) -> str:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    found = sorted(glob.glob(os.path.join(hub, f"models--{repo_id.replace('/', '--')}", "snapshots", "*",
                                          "config.json")))
    if not found:
        raise ValueError(f"{repo_id}: not in the local Hugging Face cache ({hub}); nothing is downloaded")
    return found[-1]


def _gguf_shape(path: str) -> ModelShape:
    try:
        check_regular(path, ".gguf file")  # (a FIFO would block the reader's open for good)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: not a readable GGUF file: {e.strerror or e}") from None
    try:
        import gguf

        reader = gguf.GGUFReader(path)
    except ImportError:
        raise ValueError(f"{path}: reading .gguf needs the gguf package (pip install gguf)") from None
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"{path}: not a readable GGUF file: {e}") from None
    fields = reader.fields
    arch = fields["general.architecture"].contents() if "general.architecture" in fields else "?"

    def get(key: str) -> Any:
        f = fields.get(f"{arch}.{key}")
        if f is None:
            raise ValueError(f"{path}: GGUF has no {arch}.{key} (architecture {arch!r})")
        return f.contents()
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    vocab = fields.get(f"{arch}.vocab_size")
    vocab = int(vocab.contents()) if vocab is not None else len(fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    return ModelShape(path, int(get("block_count")), hidden, heads, int(get("attention.head_count_kv")),
                      hidden // heads, int(get("feed_forward_length")), vocab, "output.weight" not in names,
                      "bfloat16")
