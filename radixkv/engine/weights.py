"""Model weights and tokenizer from `transformers`; nothing is downloaded.

The config side (ModelSpec, config.json reading) is model_config.py's. `load_checkpoint(path)`
reads a local folder saved with `save_pretrained` (safetensors or .bin, sharded or not);
`random_checkpoint(config, seed)` builds seeded random weights through transformers' own
initialiser, so `LLM(config, seed=s)` holds the same weights as
`torch.manual_seed(s); AutoModelForCausalLM.from_config(config)`.
`load_model(model, ...)` also takes a `.gguf` file (converted once to a cached folder, see
gguf.py) and a hub id already in the local Hugging Face cache (never downloaded).
`model_source(model, "dummy")` (vLLM's load_format="dummy") names a folder whose weights are never read:
random weights shaped by its config.json, with its tokenizer and chat template (`load_dummy`).

A model file that is not what it should be (config.json not JSON or of an unsupported
model_type, a truncated safetensors file, a weight of the wrong shape, a broken tokenizer)
raises ValueError naming the file, before anything runs.
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from radixkv.config import check_load_format

from .model_config import ModelSpec, build_checked, config_errors, config_from_json, read_config_dict, spec_of


class Checkpoint(NamedTuple):
    """What a model folder (or a config) provides: its config, weights and tokenizer (or None)."""

    config: Any  # transformers PretrainedConfig
    state_dict: dict[str, torch.Tensor]  # Hugging Face parameter names
    tokenizer: Any  # transformers tokenizer, or None when the folder has none
    generation_eos: frozenset[int] = frozenset()  # generation_config.json's eos ids (chat models list several)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _folder_config(path: str) -> tuple[Any, ModelSpec]:
    """The folder's config.json as a transformers config and its ModelSpec (the file checked first)."""
    from transformers import AutoConfig

    config_file = os.path.join(path, "config.json")
    read_config_dict(config_file)  # JSON, an object, a supported model_type: refused before transformers
    config = build_checked(config_file, lambda: AutoConfig.from_pretrained(path, local_files_only=True))
    return config, spec_of(config, config_file)


def load_checkpoint(path: str) -> Checkpoint:
    """Read config, weights and (when present) tokenizer from a local Hugging Face folder."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model folder {path!r} does not exist (nothing is downloaded)")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        ggufs = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
        hint = f"; pass the GGUF file itself: {os.path.join(path, ggufs[0])!r}" if ggufs else ""
        raise FileNotFoundError(f"model folder {path!r} has no config.json{hint}")
    config, spec = _folder_config(path)  # an unsupported architecture is refused before the weights are read
    state, origin = _read_weights(path)
    check_weights(spec, state, origin, path)
    return Checkpoint(config, state, folder_tokenizer(path), _generation_eos(path))


def folder_tokenizer(path: str) -> Any:
    """The folder's transformers tokenizer (its chat template included), local files only; None when the
    folder holds no tokenizer files; ValueError naming the files when they do not load."""
    present = [f for f in _TOKENIZER_FILES if os.path.exists(os.path.join(path, f))]
    if not present:
        return None
    from transformers import AutoTokenizer

    where = os.path.join(path, present[0]) if len(present) == 1 else f"{path} (tokenizer: {', '.join(present)})"
    return build_checked(where, lambda: AutoTokenizer.from_pretrained(path, local_files_only=True), Exception)


def _generation_eos(path: str) -> frozenset[int]:
    file = os.path.join(path, "generation_config.json")
    if not os.path.exists(file):
        return frozenset()
    from transformers import GenerationConfig

    eos = build_checked(file, lambda: GenerationConfig.from_pretrained(path, local_files_only=True),
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


@dataclass(frozen=True)
class DummyWeights:
    """A model folder to load with load_format="dummy" (vLLM's name): seeded random weights shaped by its
    config.json (random_checkpoint), with its tokenizer, chat template and generation_config.json EOS ids,
    so text streams and a serving benchmark measures real time to first token. Built by `model_source`;
    `load_model` takes it in place of a path (tensor-parallel workers receive it pickled)."""

    folder: str


def model_source(model: Any, load_format: str) -> Any:
    """What the engine loads for LLM(model, load_format=...): `model` itself for "auto"; for "dummy" a
    DummyWeights of its folder (a folder, a hub id in the local cache, a .gguf file's converted folder, or
    the folder of a config.json file; a transformers config already means random weights, without a
    tokenizer). ValueError naming an unknown load_format; FileNotFoundError naming a missing config.json."""
    check_load_format(load_format)
    if load_format == "auto" or isinstance(model, DummyWeights) or hasattr(model, "model_type"):
        return model
    if not (isinstance(model, str) or hasattr(model, "__fspath__")):
        raise TypeError(f"load_format='dummy' needs a model folder, a hub id or a config.json, got {model!r}")
    path = os.fspath(model)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if os.path.isfile(path) and path.lower().endswith(".json"):
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.basename(path) != "config.json":  # another name: its folder's config.json is not this file
            raise ValueError(f"load_format='dummy' reads a folder's config.json; {path!r} is another file: "
                             f"pass its folder, or load it with load_format='auto' (random weights, no tokenizer)")
    else:
        folder = resolve_model_path(path)
    config_file = os.path.join(folder, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"load_format='dummy' shapes the random weights by {config_file!r}, which does "
                                f"not exist (a dummy load needs the model folder's config.json)")
    return DummyWeights(folder)


def load_dummy(folder: str, dtype_name: str, device: torch.device, seed: int) -> LoadedModel:
    """Seeded random weights shaped by `folder`'s config.json (the weights there are never read), with the
    folder's tokenizer and generation_config.json EOS ids."""
    config, _ = _folder_config(folder)
    dtype = resolve_dtype(dtype_name, config, device)
    ckpt = random_checkpoint(config, seed, dtype, device)
    return _loaded(ckpt._replace(tokenizer=folder_tokenizer(folder), generation_eos=_generation_eos(folder)), dtype)


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
    architecture (before the weights are read) and TypeError for anything else. A DummyWeights (model_source,
    load_format="dummy") gives random weights with its folder's tokenizer."""
    if isinstance(model, DummyWeights):
        return load_dummy(model.folder, dtype_name, device, seed)
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
