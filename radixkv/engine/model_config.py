"""A model's config as the engine reads it, from `transformers`: `ModelSpec.from_hf(config)` reads the
architecture numbers the forward pass needs from a Hugging Face `PretrainedConfig` (Llama 2/3,
Mistral, Qwen2, Qwen3); `read_config_dict` / `config_from_json` read a config.json, refusing what is not
JSON, of an unsupported model_type or of impossible sizes with a ValueError naming the file.
Weights, tokenizer and the model an `LLM` names: weights.py.
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from radixkv.files import UnreadableFile, read_bounded
from radixkv.model_shape import MAX_CONFIG_BYTES


class Arch(enum.Enum):
    """Supported model families; they differ only in the flags of `ModelSpec`."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    QWEN2 = "qwen2"
    QWEN3 = "qwen3"


class RopeKind(enum.Enum):
    DEFAULT = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding parameters. `factor` etc. only matter for the scaled kinds."""

    kind: RopeKind
    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of one Llama-family model."""

    arch: Arch
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool  # Qwen2 (and Llama with attention_bias=True)
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    tie_embeddings: bool
    max_position: int  # max_position_embeddings: prompt + output must fit
    sliding_window: int | None  # Mistral/Qwen2 windowed attention; only sequences within it are served
    rope: RopeSpec
    eos_token_ids: frozenset[int]

    @staticmethod
    def from_hf(config: Any) -> "ModelSpec":
        """Read a transformers config; raises ValueError naming what is unsupported or impossible
        (a size that is not a positive integer, an odd head_dim)."""
        arch = _arch(getattr(config, "model_type", None))
        _check_sizes({k: getattr(config, k) for k in _POSITIVE_SIZES if hasattr(config, k)})
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; the Llama family uses 'silu'")
        if getattr(config, "mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} (hidden_size {config.hidden_size} / {heads} heads) must be even: "
                             f"RoPE rotates pairs of dimensions")
        eos = getattr(config, "eos_token_id", None)
        eos_ids = frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)
        return ModelSpec(
            arch=arch,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_q_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=arch is Arch.QWEN2 or bool(getattr(config, "attention_bias", False)),
            qk_norm=arch is Arch.QWEN3,
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position=config.max_position_embeddings,
            sliding_window=_sliding_window(config),
            rope=_rope_spec(config),
            eos_token_ids=eos_ids,
        )


# config sizes the forward pass divides by or allocates with (absent ones default elsewhere)
_POSITIVE_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "max_position_embeddings")


def _check_sizes(d: dict[str, Any]) -> None:
    for name in _POSITIVE_SIZES:
        v = d.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _arch(model_type: Any) -> Arch:
    try:
        return Arch(model_type)
    except ValueError:
        supported = [a.value for a in Arch]
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {supported}") from None


def _sliding_window(config: Any) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _rope_spec(config: Any) -> RopeSpec:
    # transformers 5 keeps everything in rope_parameters; 4.x had rope_theta + rope_scaling.
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    kind_name = params.get("rope_type", params.get("type", "default"))
    try:
        kind = RopeKind(kind_name)
    except ValueError:
        raise ValueError(f"unsupported rope_type {kind_name!r}; supported: {[k.value for k in RopeKind]}") from None
    if kind is RopeKind.DEFAULT:
        return RopeSpec(kind, float(theta))
    need = ("factor",) if kind is RopeKind.LINEAR else ("factor", "low_freq_factor", "high_freq_factor")
    missing = [k for k in need if k not in params]
    if missing:
        raise ValueError(f"rope_type {kind.value!r} needs {missing} in rope_scaling/rope_parameters")
    factor = float(params["factor"])
    if kind is RopeKind.LINEAR:
        return RopeSpec(kind, float(theta), factor=factor)
    return RopeSpec(
        kind,
        float(theta),
        factor=factor,
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position=int(params.get("original_max_position_embeddings", config.max_position_embeddings)),
    )


def read_config_dict(path: str) -> dict[str, Any]:
    """The JSON object of config file `path`, checked to name a supported `model_type`;
    ValueError naming the file when it is not JSON, not an object, or of another architecture."""
    try:  # a FIFO, a device or a file of more than 16 MiB is refused before it is read (radixkv/files.py)
        d = json.loads(read_bounded(path, MAX_CONFIG_BYTES, "config.json").decode("utf-8"))
    except UnreadableFile:
        raise
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # a 5,000-digit number, nesting thousands deep
        raise ValueError(f"{path}: not valid JSON ({type(e).__name__})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a model config (a JSON {type(d).__name__}, not an object)")
    if "model_type" not in d:
        raise ValueError(f"{path}: not a model config (no 'model_type')")
    try:
        _arch(d["model_type"])
        _check_sizes(d)  # before transformers divides by a head count of 0
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return d


def config_errors() -> tuple[type[Exception], ...]:
    """What building a transformers config from bad values raises: ValueError, TypeError, and
    huggingface_hub's strict-dataclass validation errors (transformers 5 validates on init)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return (ValueError, TypeError)
    return (ValueError, TypeError, StrictDataclassError)


def build_checked(where: str, build: Any, errors: Any = None) -> Any:
    """build(), with what it raises for bad file contents as a ValueError naming `where`."""
    caught = errors or config_errors() + (KeyError, ArithmeticError)
    try:
        return build()
    except caught as e:
        raise ValueError(f"{where}: {error_detail(e)}") from e


def error_detail(e: BaseException) -> str:
    """The telling last line of an error (strict-dataclass errors put the cause last, as
    `ValueError: The hidden size ...`), without its class name."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return re.sub(r"^\w+(Error|Exception): ", "", lines[-1]) if lines else type(e).__name__


def spec_of(config: Any, where: str) -> ModelSpec:
    """ModelSpec.from_hf(config), its ValueError prefixed with the config file `where`."""
    try:
        return ModelSpec.from_hf(config)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def config_from_json(path: str) -> Any:
    """A transformers config from a config.json file (its `model_type` picks the class); ValueError
    naming the file when it is not JSON, of an unsupported model_type, or holds impossible values."""
    from transformers import AutoConfig

    d = read_config_dict(path)
    return build_checked(path, lambda: AutoConfig.for_model(d.pop("model_type"), **d))
