"""Model facts, weights and tokenizer from `transformers`; nothing is downloaded.

`ModelSpec.from_hf(config)` reads the architecture numbers the forward pass needs from a
Hugging Face `PretrainedConfig` (Llama 2/3, Mistral, Qwen2, Qwen3). `load_checkpoint(path)`
reads a local folder saved with `save_pretrained` (safetensors or .bin, sharded or not);
`random_checkpoint(config, seed)` builds seeded random weights through transformers' own
initialiser, so `LLM(config, seed=s)` holds the same weights as
`torch.manual_seed(s); AutoModelForCausalLM.from_config(config)`.
`load_model(model, ...)` also takes a `.gguf` file (converted once to a cached folder, see
gguf.py) and a hub id already in the local Hugging Face cache (never downloaded).
"""
from __future__ import annotations

import enum
import glob
import os
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


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
        """Read a transformers config; raises ValueError naming what is unsupported."""
        model_type = getattr(config, "model_type", None)
        try:
            arch = Arch(model_type)
        except ValueError:
            supported = [a.value for a in Arch]
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {supported}") from None
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


class Checkpoint(NamedTuple):
    """What a model folder (or a config) provides: its config, weights and tokenizer (or None)."""

    config: Any  # transformers PretrainedConfig
    state_dict: dict[str, torch.Tensor]  # Hugging Face parameter names
    tokenizer: Any  # transformers tokenizer, or None when the folder has none
    generation_eos: frozenset[int] = frozenset()  # generation_config.json's eos ids (chat models list several)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_checkpoint(path: str) -> Checkpoint:
    """Read config, weights and (when present) tokenizer from a local Hugging Face folder."""
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise FileNotFoundError(f"model folder {path!r} does not exist (nothing is downloaded)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
        hint = f"; pass the GGUF file itself: {os.path.join(path, ggufs[0])!r}" if ggufs else ""
        raise FileNotFoundError(f"model folder {path!r} has no config.json{hint}")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    ModelSpec.from_hf(config)  # an unsupported architecture is refused before the weights are read
    state = _read_weights(path)
    tokenizer = None
    if any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return Checkpoint(config, state, tokenizer, _generation_eos(path))


def _generation_eos(path: str) -> frozenset[int]:
    if not os.path.exists(os.path.join(path, "generation_config.json")):
        return frozenset()
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        return state
    files = sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path!r}")
    state = {}
    for f in files:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def random_checkpoint(config: Any, seed: int, dtype: torch.dtype, device: torch.device) -> Checkpoint:
    """Seeded random weights from transformers' initialiser, built directly on `device`.

    The global RNG is left untouched (forked), so building a model never changes a caller's stream.
    """
    from transformers import AutoModelForCausalLM

    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        with torch.device(device):
            hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {k: v.detach() for k, v in hf.state_dict().items()}
    return Checkpoint(config, state, None)


class LoadedModel(NamedTuple):
    """A model ready for the engine: its spec, weights in `dtype`, tokenizer and stop ids."""

    spec: ModelSpec
    config: Any  # transformers PretrainedConfig
    state_dict: dict[str, torch.Tensor]
    dtype: torch.dtype  # compute dtype
    tokenizer: Any  # or None
    eos_token_ids: frozenset[int]  # config's and generation_config's (HF generate reads both)


def load_model(model: Any, dtype_name: str, device: torch.device, seed: int) -> LoadedModel:
    """The model an `LLM(model, ...)` names; dtype_name: config.DTYPES.

    model: a local Hugging Face folder; a `.gguf` file (converted once into a cached folder,
    see gguf.py); a hub id ("org/name") already in the local Hugging Face cache; a config.json
    file or a transformers PretrainedConfig (both: seeded random weights). An existing path
    wins over a hub id. Nothing is ever downloaded. Raises FileNotFoundError for a missing
    path, folder without config.json or uncached hub id, ValueError for an unsupported
    architecture (before the weights are read) and TypeError for anything else."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        path = os.fspath(model)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if os.path.isfile(path) and path.lower().endswith(".json"):
            model = config_from_json(path)
        else:
            ckpt = load_checkpoint(resolve_model_path(path))
            dtype = resolve_dtype(dtype_name, ckpt.config, device)
            return _loaded(ckpt, dtype)
    if not hasattr(model, "model_type"):
        raise TypeError(f"model must be a folder path, a .gguf file, a hub id, a config.json or a transformers "
                        f"PretrainedConfig, got {model!r}")
    ModelSpec.from_hf(model)  # refuse an unsupported architecture before building its weights
    dtype = resolve_dtype(dtype_name, model, device)
    return _loaded(random_checkpoint(model, seed, dtype, device), dtype)


# "org/name" as the hub spells repo ids: one slash, no path-like parts
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def resolve_model_path(name: str) -> str:
    """The local folder `name` stands for: an existing folder as is, a `.gguf` file's cached
    conversion, or the snapshot of hub id `name` in the local Hugging Face cache."""
    if os.path.isdir(name):
        return name
    if os.path.isfile(name):
        if name.lower().endswith(".gguf"):
            from .gguf import cached_hf_folder

            return cached_hf_folder(name, check_config=ModelSpec.from_hf)
        raise ValueError(f"{name!r} is a file but not a .gguf or config.json; pass a model folder, "
                         f"a .gguf file or a config.json")
    if _HUB_ID.fullmatch(name) and not name.lower().endswith((".gguf", ".json")):
        return _cached_snapshot(name)
    raise FileNotFoundError(f"model path {name!r} does not exist")


def _cached_snapshot(repo_id: str) -> str:
    """The local snapshot folder of hub repo `repo_id`; never downloads."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:  # transformers depends on it, but be clear if it is missing
        raise FileNotFoundError(f"model {repo_id!r} is not a local path, and huggingface_hub is not installed "
                                f"to look it up in the Hugging Face cache (nothing is downloaded)") from None
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError, HFValidationError, offline-mode errors
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local path nor a hub id in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); nothing is downloaded: fetch it once "
            f"(`hf download {repo_id}`) or pass a local folder or .gguf file") from e


def _loaded(ckpt: Checkpoint, dtype: torch.dtype) -> LoadedModel:
    spec = ModelSpec.from_hf(ckpt.config)
    return LoadedModel(spec, ckpt.config, ckpt.state_dict, dtype, ckpt.tokenizer,
                       spec.eos_token_ids | ckpt.generation_eos)


def config_from_json(path: str) -> Any:
    """A transformers config from a config.json file (its `model_type` picks the class)."""
    import json

    from transformers import AutoConfig

    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict) or "model_type" not in d:
        raise ValueError(f"{path}: not a model config (no 'model_type')")
    return AutoConfig.for_model(d.pop("model_type"), **d)


def resolve_dtype(name: str, hf_config: Any, device: torch.device) -> torch.dtype:
    """The compute dtype: `name` unless "auto"; then the checkpoint's, bf16 for fp32 on CUDA, fp32 for fp16 on CPU."""
    if name != "auto":
        return getattr(torch, name)
    # transformers 5 names it `dtype`; 4.x `torch_dtype` (reading that in 5.x warns)
    d = getattr(hf_config, "dtype", None) if hasattr(hf_config, "dtype") else getattr(hf_config, "torch_dtype", None)
    if isinstance(d, str):
        d = getattr(torch, d, None)
    if not isinstance(d, torch.dtype) or not d.is_floating_point:
        d = torch.float32
    if device.type == "cuda" and d == torch.float32:
        return torch.bfloat16
    if device.type != "cuda" and d == torch.float16:
        return torch.float32  # fp16 matmuls on CPU are slow and lossy; fp32 is exact
    return d
