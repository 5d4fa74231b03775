"""Set up the peer radix caches that bench_tree_peers.py replays beside radixkv.

Nothing of the peers is committed: everything lands in benchmarks/cache/peers/ (git-ignored).

    python benchmarks/cache/setup_peers.py [--sglang-version 0.5.23] [--minisgl-git DIR] [--no-build]

- SGLang: `pip download --no-deps sglang==VERSION` (the wheel), then only the radix cache files
  of sglang/srt/mem_cache/ (radix_cache.py, base_prefix_cache.py, evict_policy.py, utils.py,
  cache_init_params.py, events.py) are unpacked, verbatim, into peers/sglang/. Their imports of
  the rest of SGLang (allocators, metrics, kernels, environment) are small stub modules written
  here; a stub's names are dummies unless the replay calls them (ceil_align is real).
- mini-sglang: from a bare git directory (the `fetch` tool's mirror of sgl-project/mini-sglang,
  default /work/.mirror/sgl-project+mini-sglang/repo) `git archive` extracts
  python/minisgl/kvcache/{radix_cache,base}.py and the key-compare kernel
  (python/minisgl/kernel/{radix,utils}.py, csrc/src/radix.cpp, csrc/include/) into peers/minisgl/;
  stubs stand in for minisgl.core (page size), minisgl.utils (align_down) and the package
  __init__s (so no CUDA kernels or models are imported). Its C++ compare (`fast_compare_key`)
  builds through apache-tvm-ffi (pip-installed into peers/site/, the build goes to peers/build/);
  if that fails, a stand-in compare in torch is used (mini-sglang has no pure-Python compare of
  its own) and peers/minisgl/COMPARE says which one is in use.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
MINISGL_GIT = Path("/work/.mirror/sgl-project+mini-sglang/repo")

SGLANG_FILES = ["radix_cache.py", "base_prefix_cache.py", "evict_policy.py", "utils.py",
                "cache_init_params.py", "events.py"]

# A module whose every name is a dummy class (PEP 562 module __getattr__ answers `from m import x`).
_ANY = '''"""Stub written by benchmarks/cache/setup_peers.py: every name is a dummy."""


class _Dummy:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return None


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Dummy,), {})
'''

SGLANG_STUBS = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/allocator/__init__.py": _ANY,
    "sglang/srt/mem_cache/memory_pool.py": _ANY,
    "sglang/srt/mem_cache/unified_cache/__init__.py": "",
    "sglang/srt/mem_cache/unified_cache/component_type.py": _ANY,
    "sglang/srt/mem_cache/cpp_utils/__init__.py": "",
    "sglang/srt/mem_cache/cpp_utils/native_hash.py": _ANY,
    "sglang/srt/observability/__init__.py": "",
    "sglang/srt/observability/metrics_collector.py": _ANY,
    "sglang/srt/runtime_context.py": _ANY,
    "sglang/srt/environ.py": _ANY,
    "sglang/srt/disaggregation/__init__.py": "",
    "sglang/srt/disaggregation/kv_events.py": _ANY,
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/kvcache/__init__.py": "",
    "sglang/kernels/ops/kvcache/mla_buffer.py": _ANY,
    "sglang/srt/utils/__init__.py": "",
    "sglang/srt/utils/common.py": '''"""Stub: the two helpers radix_cache.py uses, as SGLang defines them."""


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def ceil_align(x: int, y: int) -> int:
    return ceil_div(x, y) * y
''',
}

MINISGL_FILES = ["python/minisgl/kvcache/radix_cache.py", "python/minisgl/kvcache/base.py",
                 "python/minisgl/kernel/radix.py", "python/minisgl/kernel/utils.py",
                 "python/minisgl/kernel/csrc/src/radix.cpp", "python/minisgl/kernel/csrc/include"]

MINISGL_STUBS = {
    "minisgl/__init__.py": "",
    "minisgl/kvcache/__init__.py": "",
    "minisgl/core.py": '''"""Stub: the global context radix_cache.py reads (its page size only)."""


class _Ctx:
    page_size = 16


_CTX = _Ctx()


def get_global_ctx():
    return _CTX
''',
    "minisgl/utils.py": '''"""Stub: align_down as minisgl.utils defines it."""


def align_down(x: int, y: int) -> int:
    return x // y * y
''',
}

_MINISGL_KERNEL_INIT = '''"""Stub written by setup_peers.py: only the radix key compare of minisgl.kernel.

COMPARE (beside this package) says whether the C++ kernel (tvm-ffi) or the torch stand-in runs."""
from pathlib import Path

if (Path(__file__).resolve().parents[2] / "COMPARE").read_text().strip() == "cpp":
    from .radix import fast_compare_key
else:
    import torch

    def fast_compare_key(x, y) -> int:  # stand-in: mini-sglang has no pure-Python compare
        n = min(len(x), len(y))
        diff = torch.nonzero(x[:n] != y[:n])
        return int(diff[0, 0]) if len(diff) else n

__all__ = ["fast_compare_key"]
'''


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def setup_sglang(version: str) -> str:
    dl = PEERS / "_download"
    dl.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dl.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", f"sglang=={version}", "-d", str(dl)],
                       check=True)
        wheels = sorted(dl.glob(f"sglang-{version}-*.whl"))
    wheel = wheels[-1]
    root = PEERS / "sglang"
    with zipfile.ZipFile(wheel) as z:
        for name in SGLANG_FILES:
            p = root / "sglang/srt/mem_cache" / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(z.read(f"sglang/srt/mem_cache/{name}"))
    _write(root, SGLANG_STUBS)
    (root / "VERSION").write_text(f"{version} {wheel.name}\n")
    return f"sglang {version} from {wheel.name}"


def _build_minisgl_compare(root: Path) -> str:
    """Install apache-tvm-ffi into peers/site and build radix.cpp; returns 'cpp' or 'torch'."""
    site = PEERS / "site"
    if not (site / "tvm_ffi").exists():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(site), "apache-tvm-ffi"])
        if r.returncode:
            return "torch"
    code = (f"import sys; sys.path[:0] = [{str(site)!r}, {str(root)!r}]\n"
            "import os, torch\n"
            f"os.environ.setdefault('TVM_FFI_CACHE_DIR', {str(PEERS / 'build')!r})\n"
            "from minisgl.kernel.radix import fast_compare_key as f\n"
            "a = torch.arange(40, dtype=torch.int32); b = a.clone(); b[33] = -1\n"
            "assert f(a, b) == 33 and f(a, a[:20]) == 20, 'compare is wrong'\n")
    r = subprocess.run([sys.executable, "-c", code])
    return "cpp" if r.returncode == 0 else "torch"


def setup_minisgl(git_dir: Path, build: bool) -> str:
    if not git_dir.exists():
        raise SystemExit(f"{git_dir}: no mini-sglang mirror (fetch github:sgl-project/mini-sglang first)")
    root = PEERS / "minisgl"
    commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "HEAD", *MINISGL_FILES], check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t.getmembers():
            if m.isfile():
                p = root / m.name.removeprefix("python/")
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(t.extractfile(m).read())
    _write(root, MINISGL_STUBS)
    _write(root, {"minisgl/kernel/__init__.py": _MINISGL_KERNEL_INIT})
    (root / "COMPARE").write_text("torch\n")  # until the C++ build is proven
    compare = _build_minisgl_compare(root) if build else "torch"
    (root / "COMPARE").write_text(compare + "\n")
    (root / "VERSION").write_text(f"{commit}\n")
    return f"mini-sglang {commit[:10]}, key compare: {compare}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-version", default="0.5.23")
    ap.add_argument("--minisgl-git", type=Path, default=MINISGL_GIT)
    ap.add_argument("--no-build", action="store_true", help="skip the C++ compare (use the torch stand-in)")
    args = ap.parse_args()
    PEERS.mkdir(exist_ok=True)
    print(setup_sglang(args.sglang_version))
    print(setup_minisgl(args.minisgl_git, not args.no_build))


if __name__ == "__main__":
    main()
