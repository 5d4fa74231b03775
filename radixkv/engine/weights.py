"""Model facts, weights and tokenizer from `transformers`; nothing is downloaded.

`ModelSpec.from_hf(config)` reads the architecture numbers the forward pass needs from a
Hugging Face `PretrainedConfig` (Llama 2/3, Mistral, Qwen2, Qwen3). `load_checkpoint(path)`
reads a local folder saved with `save_pretrained` (safetensors or .bin, sharded or not);
`random_checkpoint(config, seed)` builds seeded random weights through transformers' own
initialiser, so `LLM(config, seed=s)` holds the same weights as
`torch.manual_seed(s); AutoModelForCausalLM.from_config(config)`.
`load_model(model, ...)` also takes a `.gguf` file (converted once to a cached folder, see
gguf.py) and a hub id already in the local Hugging Face cache (never downloaded).

A model file that is not what it should be (config.json not JSON or of an unsupported
model_type, a truncated safetensors file, a weight of the wrong shape, a broken tokenizer)
raises ValueError naming the file, before anything runs.
"""
from __future__ import annotations

import enum
import glob
import json
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
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        ggufs = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
        hint = f"; pass the GGUF file itself: {os.path.join(path, ggufs[0])!r}" if ggufs else ""
        raise FileNotFoundError(f"model folder {path!r} has no config.json{hint}")
    read_config_dict(config_file)  # JSON, an object, a supported model_type: refused before transformers
    config = _built(config_file, lambda: AutoConfig.from_pretrained(path, local_files_only=True))
    spec = spec_of(config, config_file)  # an unsupported architecture is refused before the weights are read
    state, origin = _read_weights(path)
    check_weights(spec, state, origin, path)
    tokenizer = None
    present = [f for f in _TOKENIZER_FILES if os.path.exists(os.path.join(path, f))]
    if present:
        from transformers import AutoTokenizer

        where = os.path.join(path, present[0]) if len(present) == 1 else f"{path} (tokenizer: {', '.join(present)})"
        tokenizer = _built(where, lambda: AutoTokenizer.from_pretrained(path, local_files_only=True), Exception)
    return Checkpoint(config, state, tokenizer, _generation_eos(path))


def read_config_dict(path: str) -> dict[str, Any]:
    """The JSON object of config file `path`, checked to name a supported `model_type`;
    ValueError naming the file when it is not JSON, not an object, or of another architecture."""
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read().decode("utf-8"))
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


def _built(where: str, build: Any, errors: Any = None) -> Any:
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


def _generation_eos(path: str) -> frozenset[int]:
    file = os.path.join(path, "generation_config.json")
    if not os.path.exists(file):
        return frozenset()
    from transformers import GenerationConfig

    eos = _built(file, lambda: GenerationConfig.from_pretrained(path, local_files_only=True),
                 config_errors() + (OSError, KeyError)).eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def _read_weights(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(state dict, the file each tensor came from); ValueError naming a file that is truncated,
    corrupt or missing from the shard index."""
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        _check_shard_index(os.path.join(path, "model.safetensors.index.json"))
        for f in files:
            try:
                part = load_file(f)
            except (SafetensorError, ValueError, RuntimeError) as e:
                raise ValueError(f"{f}: not a readable safetensors file ({one_line(e)}); "
                                 f"it may be truncated or corrupt") from None
            state.update(part)
            origin.update(dict.fromkeys(part, f))
        return state, origin
    files = sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path!r}")
    for f in files:
        try:
            part = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError (not a zip), EOFError (cut short)
            raise ValueError(f"{f}: cannot read PyTorch weights ({type(e).__name__}: "
                             f"{one_line(e).split('. ')[0][:200]}); "
                             f"it may be truncated or corrupt") from None
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise ValueError(f"{f}: not a state dict (a {type(part).__name__} of tensors by name)")
        state.update(part)
        origin.update(dict.fromkeys(part, f))
    return state, origin


def _check_shard_index(index: str) -> None:
    """Every shard a `model.safetensors.index.json` lists must exist (a partial download)."""
    if not os.path.isfile(index):
        return
    try:
        with open(index) as f:
            shards = set(json.load(f)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a shard index ({type(e).__name__}: {one_line(e)})") from None
    missing = sorted(s for s in shards if not os.path.isfile(os.path.join(os.path.dirname(index), str(s))))
    if missing:
        raise FileNotFoundError(f"{index}: lists {len(missing)} shard(s) that are missing, e.g. {missing[0]!r} "
                                f"(an incomplete download?)")


def one_line(e: object) -> str:
    return " ".join(part.strip() for part in str(e).splitlines() if part.strip())


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, by Hugging Face name, with its shape from `spec`;
    the embedding's (and lm_head's) row count is free (-1): a checkpoint may pad its vocabulary."""
    s = spec
    H, D, q, kv = s.hidden_size, s.head_dim, s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (-1, H), "model.norm.weight": (H,)}
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        layer = {"self_attn.q_proj.weight": (q, H), "self_attn.k_proj.weight": (kv, H),
                 "self_attn.v_proj.weight": (kv, H), "self_attn.o_proj.weight": (H, q),
                 "mlp.gate_proj.weight": (s.intermediate_size, H), "mlp.up_proj.weight": (s.intermediate_size, H),
                 "mlp.down_proj.weight": (H, s.intermediate_size),
                 "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}
        if s.qkv_bias:
            layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                          "self_attn.v_proj.bias": (kv,)})
        if s.qk_norm:
            layer.update({"self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,)})
        shapes.update({p + k: v for k, v in layer.items()})
    return shapes


def check_weights(spec: ModelSpec, state: dict[str, torch.Tensor], origin: dict[str, str], folder: str) -> None:
    """The checkpoint holds every tensor the config needs, each of its shape; ValueError naming
    the file of a tensor of the wrong shape, or the folder and the first tensors missing."""
    need = expected_shapes(spec)
    optional = {"lm_head.weight": (-1, spec.hidden_size)}
    optional.update({f"model.layers.{i}.self_attn.o_proj.bias": (spec.hidden_size,) for i in range(spec.num_layers)})
    for name, want in {**need, **optional}.items():
        t = state.get(name)
        if t is None:
            continue
        got = tuple(t.shape)
        if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got)) or 0 in got:
            shown = [("any" if w == -1 else w) for w in want]
            raise ValueError(f"{origin.get(name, folder)}: tensor {name!r} has shape {list(got)}, but config.json "
                             f"needs {shown}: the weights do not belong to this config")
    missing = [k for k in need if k not in state]
    if missing:
        raise ValueError(f"{folder}: the weights lack {len(missing)} of the {len(need)} tensors config.json needs, "
                         f"e.g. {missing[:3]}; is this a Llama-family causal LM saved with save_pretrained?")


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
            spec_of(model, path)  # sizes a Llama cannot have, named with the file
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
    """A transformers config from a config.json file (its `model_type` picks the class); ValueError
    naming the file when it is not JSON, of an unsupported model_type, or holds impossible values."""
    from transformers import AutoConfig

    d = read_config_dict(path)
    return _built(path, lambda: AutoConfig.for_model(d.pop("model_type"), **d))


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
