"""Prometheus series of one server, named as vLLM names them under a `radixkv:` prefix.

vLLM's `vllm:prompt_tokens_total` is `radixkv:prompt_tokens_total` here, and so on, each with a
`model_name` label, so a vLLM dashboard works after replacing the prefix. Every server has its own
CollectorRegistry (no module globals: tests run several servers in one process).

Counters (exposed with `_total`): prompt_tokens, generation_tokens, prefix_cache_queries and
prefix_cache_hits (tokens: prompt tokens looked up / served from the cache), num_preemptions,
request_success (label finished_reason: stop, length, abort), request_failure (a failed step),
http_requests (labels endpoint, status). Gauges: num_requests_running, num_requests_waiting,
kv_cache_usage_perc (0..1: pages held by requests or cache that eviction cannot free).
The host KV tier (issue 37; zero without one): counters prefix_cache_hits_by_tier (label tier: gpu, host:
hit tokens by where their KV was at admission), kv_transfer_bytes (label direction: d2h = demotions to
host, h2d = loads back), kv_transfer_failures; gauge host_kv_cache_usage_perc (host pages the tree holds).
Histograms (seconds): time_to_first_token_seconds, time_per_output_token_seconds,
e2e_request_latency_seconds.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from radixkv.engine.core import EngineStats

PREFIX = "radixkv:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServeMetrics:
    """The server's series; AsyncLLM calls `on_step` / `on_finish`, the app counts HTTP requests."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        self._last = EngineStats(0, 0, 1, 0, 0, 0, 0, 0, 0)  # the core's counters at the last step
        lab = ["model_name"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, lab + list(extra), registry=reg)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, lab, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, lab, buckets=buckets, registry=reg).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens admitted.").labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Tokens generated.").labels(model_name)
        self.prefix_cache_queries = counter("prefix_cache_queries",
                                            "Prompt tokens looked up in the prefix cache.").labels(model_name)
        self.prefix_cache_hits = counter("prefix_cache_hits",
                                         "Prompt tokens served from the prefix cache.").labels(model_name)
        self.num_preemptions = counter("num_preemptions", "Requests preempted (pages released, requeued).") \
            .labels(model_name)
        steps = counter("engine_steps", "Engine steps, by kind: decode (decode rows only: a CUDA graph) or mixed "
                        "(some row computes prompt tokens).", ("kind",))
        self.decode_steps, self.mixed_steps = steps.labels(model_name, "decode"), steps.labels(model_name, "mixed")
        self.request_success = counter("request_success", "Requests finished, by finish reason.",
                                       ("finished_reason",))
        self.request_failure = counter("request_failure", "Requests failed by an engine step error.") \
            .labels(model_name)
        self.http_requests = counter("http_requests", "HTTP requests, by endpoint and status.",
                                     ("endpoint", "status"))
        tiers = counter("prefix_cache_hits_by_tier", "Prompt tokens served from the prefix cache, by the tier "
                        "their KV was on at admission (host: loaded back from the host KV tier).", ("tier",))
        self.hits_gpu, self.hits_host = tiers.labels(model_name, "gpu"), tiers.labels(model_name, "host")
        moved = counter("kv_transfer_bytes", "KV bytes copied between the GPU pool and the host tier, by direction "
                        "(d2h: demotions, h2d: loads).", ("direction",))
        self.bytes_d2h, self.bytes_h2d = moved.labels(model_name, "d2h"), moved.labels(model_name, "h2d")
        self.transfer_failures = counter("kv_transfer_failures", "Host-tier copies that failed (blocks dropped or "
                                         "recomputed).").labels(model_name)
        self.host_kv_cache_usage_perc = gauge("host_kv_cache_usage_perc",
                                              "Fraction of the host KV tier's pages holding cached blocks.")
        self.num_requests_running = gauge("num_requests_running", "Requests in the running set.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be admitted.")
        self.kv_cache_usage_perc = gauge("kv_cache_usage_perc",
                                         "Fraction of KV pages in use (1 = full; evictable cache counts as free).")
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.time_per_output_token = histogram("time_per_output_token_seconds",
                                               "Mean time per output token after the first, per request.",
                                               TPOT_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "End-to-end request latency.",
                                             E2E_BUCKETS)

    # ---- called by AsyncLLM after each engine step ---------------------------------------------
    def on_step(self, stats: EngineStats, generation_tokens: int) -> None:
        """stats: the core's snapshot after the step (counters are totals: the increase is counted)."""
        last = self._last
        for counter, now, before in ((self.prompt_tokens, stats.prompt_tokens, last.prompt_tokens),
                                     (self.prefix_cache_queries, stats.prompt_tokens, last.prompt_tokens),
                                     (self.prefix_cache_hits, stats.hit_tokens, last.hit_tokens),
                                     (self.num_preemptions, stats.preemptions, last.preemptions),
                                     (self.mixed_steps, stats.mixed_steps, last.mixed_steps),
                                     (self.decode_steps, stats.num_steps - stats.mixed_steps,
                                      last.num_steps - last.mixed_steps),
                                     (self.hits_gpu, stats.gpu_hit_tokens, last.gpu_hit_tokens),
                                     (self.hits_host, stats.host_hit_tokens, last.host_hit_tokens),
                                     (self.bytes_d2h, stats.bytes_d2h, last.bytes_d2h),
                                     (self.bytes_h2d, stats.bytes_h2d, last.bytes_h2d),
                                     (self.transfer_failures, stats.failed_copies, last.failed_copies)):
            if now > before:
                counter.inc(now - before)
        if generation_tokens:
            self.generation_tokens.inc(generation_tokens)
        self._last = stats
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.kv_cache_usage_perc.set(stats.kv_usage)
        self.host_kv_cache_usage_perc.set(stats.host_pages_used / stats.host_pages if stats.host_pages else 0.0)

    def on_finish(self, stats: Any, reason: str, num_generated: int) -> None:
        """stats: the request's StreamStats (arrival, first_token, finished: monotonic seconds)."""
        if reason == "error":
            self.request_failure.inc()
            return
        self.request_success.labels(self.model_name, reason).inc()
        self.e2e_request_latency.observe(stats.finished - stats.arrival)
        if stats.first_token is not None:
            self.time_to_first_token.observe(stats.first_token - stats.arrival)
            if num_generated > 1:
                self.time_per_output_token.observe((stats.finished - stats.first_token) / (num_generated - 1))

    # ---- called by the app -------------------------------------------------------------------
    def count_http(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(self.model_name, endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
