#!/usr/bin/env bash
# Issue 31 item 5 on one H200: cold start, load sweep (server and in-process), ShareGPT offline, few-shot
# `default`; about 10 minutes in two calls; a summary table last. Llama-3-8B shape, random bf16 weights from a config.json
# (written by each script; nothing downloaded), token-id prompts.
#
# 1. Here, once (copies what the GPU machine cannot reach into the git-ignored .devshare/: ShareGPT, GSM8K
#    and SmolLM2's tokenizer files, ~24 MB):
#        bash benchmarks/serve/run_h200.sh --prepare
# 2. Two device calls (each well inside the 10-minute limit of one command; .whl holds the server's wheels):
#        run(command="bash benchmarks/serve/run_h200.sh serve", carry=[".whl", ".devshare"], timeout_s=600)
#            cold start + load sweep, ~6 min
#        run(command="bash benchmarks/serve/run_h200.sh offline", carry=[".whl", ".devshare"], timeout_s=600)
#            ShareGPT offline (3 configs x 1,000 requests, ~350 output tokens each) + few-shot default, ~4 min
#    (`bash benchmarks/serve/run_h200.sh` alone runs both, ~10 min: too close to one call's limit.)
# 3. The JSONs, the plot and the log come back under $OUT: copy them into benchmarks/results/ and docs/
#    (the plot can be redrawn here: python benchmarks/serve/load_sweep.py --plot-only).
#
# SMOKE=1 bash benchmarks/serve/run_h200.sh: the same sequence at --smoke sizes on the CPU (rows go to a temp
# folder, no wheels installed): checks this script.
#
# Each stage merges its rows into benchmarks/results/*.json as it finishes and copies them to $OUT, so
# a stage cut short by its own `timeout` still leaves the earlier stages' figures.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  src=${SHARED:-../shared/traces}
  mkdir -p .devshare/sharegpt .devshare/gsm8k .devshare/smollm2-tokenizer
  cp -f "$src/sharegpt/sharegpt_v3_multiturn_first2000.jsonl" .devshare/sharegpt/
  cp -f "$src/gsm8k/train.jsonl" "$src/gsm8k/test.jsonl" .devshare/gsm8k/
  folder=$(python -c "from radixkv.engine.gguf import cached_hf_folder, smollm2_gguf_path; print(cached_hf_folder(smollm2_gguf_path()))")
  for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
    if [ -f "$folder/$f" ]; then cp -f "$folder/$f" .devshare/smollm2-tokenizer/; fi
  done
  du -sh .devshare .whl
  exit 0
fi

stage=${1:-all}
OUT=${OUT:-/tmp/radixkv-h200-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_h200.log") 2>&1
export PYTHONUNBUFFERED=1
SMOKE=${SMOKE:-}
S=${SMOKE:+--smoke}
LOAD_SIZES="--duration 5 --min-requests 24"  # the load sweep's H200 sizes: ~5 s of arrivals a rate
[ -n "$SMOKE" ] && LOAD_SIZES=""
case "$stage" in all|serve|offline) ;; *) echo "usage: $0 [--prepare | all | serve | offline]"; exit 2;; esac
if [ -z "$SMOKE" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
python3 -c "import radixkv.kernels" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
for f in .devshare/sharegpt/sharegpt_v3_multiturn_first2000.jsonl .devshare/gsm8k/test.jsonl .devshare/smollm2-tokenizer/tokenizer.json; do
  [ -f "$f" ] || { echo "missing $f: run 'bash benchmarks/serve/run_h200.sh --prepare' here first and carry .devshare"; exit 1; }
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
# One empty Triton cache for the whole run: cold_start (first) finds nothing compiled, later stages reuse its kernels.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$(mktemp -d /tmp/triton-cache-XXXX)}
R=benchmarks/results
PLOT=docs/serve_load.png
if [ -n "$SMOKE" ]; then R=/tmp/radixkv-bench-smoke; PLOT=$R/serve_load.png; mkdir -p $R; fi
save() { cp -f $R/serve_load.json $R/cold_start.json $R/sharegpt_offline.json $R/e2e.json $PLOT "$OUT"/ 2>/dev/null; true; }
t0=$SECONDS
stamp() { echo "=== [$((SECONDS - t0)) s] $*"; }

if [ "$stage" = all ] || [ "$stage" = serve ]; then
  stamp "cold start (fresh server, empty Triton cache)"
  timeout 200 python3 benchmarks/serve/cold_start.py $S --keep-triton-cache --log-dir /tmp/rkv-cold
  save
  stamp "load sweep: shared-prefix + ShareGPT at 4/16/48/96 req/s, server then in-process"
  timeout 370 python3 benchmarks/serve/load_sweep.py $S $LOAD_SIZES --log-dir /tmp/rkv-load
  save
fi
if [ "$stage" = all ] || [ "$stage" = offline ]; then
  stamp "ShareGPT offline, 1,000 requests (8B shape, SmolLM2's vocabulary)"
  timeout 330 python3 benchmarks/serve/sharegpt_offline.py $S --configs default max_num_seqs=1024 \
    kv_dtype=fp8_e4m3,max_num_seqs=1024 --log-dir /tmp/rkv-sharegpt
  save
  stamp "few-shot (512 x 8-shot GSM8K), config default -> e2e.json"
  timeout 180 python3 benchmarks/engine/bench_e2e_gpu.py $S --parts B --skip-checks --only few-shot --configs default \
    --gsm8k .devshare/gsm8k --json $R/e2e.json
  save
  stamp "prompt logprobs: 64 x 1k-token prompts with and without (issue 32 target)"
  timeout 150 python3 benchmarks/engine/prompt_logprobs_cost.py $S --json $R/prompt_logprobs.json
  cp -f $R/prompt_logprobs.json "$OUT"/ 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C /tmp rkv-cold/server.log rkv-load/server.log 2>/dev/null || true
stamp "done"
python3 benchmarks/serve/summary.py --dir $R
