"""Prometheus metrics of the server (GET /metrics), on a registry of its own."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..generation import Generation

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, pool):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("cospec_requests", "HTTP requests answered, by endpoint and status.",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("cospec_prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.completion_tokens = Counter("cospec_completion_tokens", "Tokens generated.", registry=r)
        self.drafted = Counter("cospec_draft_tokens", "Tokens the draft proposed.", registry=r)
        self.accepted = Counter("cospec_draft_accepted_tokens", "Drafted tokens that reached the output "
                                                                "(matched or kept).", registry=r)
        # Per draft source: of the counts above, the n-gram drafter's and the draft model's.
        self.drafted_by = Counter("cospec_draft_tokens_by_source", "Tokens proposed, by draft source (ngram, head, model).",
                                  ["source"], registry=r)
        self.accepted_by = Counter("cospec_draft_accepted_tokens_by_source", "Proposed tokens that reached the "
                                   "output, by draft source (ngram, head, model).", ["source"], registry=r)
        self.kept = Counter("cospec_arbiter_kept_tokens", "Mismatched draft tokens the arbiter kept.", registry=r)
        self.fallbacks = Counter("cospec_target_fallback_tokens", "Mismatches settled with the target's token.",
                                 registry=r)
        self.aborted = Counter("cospec_generations_aborted", "Generations stopped early (client gone).", registry=r)
        self.latency = Histogram("cospec_request_duration_seconds", "Time from request to last token.",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("cospec_time_to_first_token_seconds", "Time from request to first token.",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        Gauge("cospec_acceptance_ratio", "Share of drafted tokens that reached the output, since start.",
              registry=r).set_function(lambda: self.accepted._value.get() / max(1.0, self.drafted._value.get()))
        Gauge("cospec_engines_busy", "Engines generating now.", registry=r).set_function(lambda: pool.busy)
        Gauge("cospec_engines", "Engines (--parallel).", registry=r).set_function(lambda: len(pool.workers))
        Gauge("cospec_engines_alive", "Engine processes running.", registry=r).set_function(lambda: pool.alive)
        Gauge("cospec_requests_waiting", "Requests waiting for an engine.", registry=r).set_function(
            lambda: pool.waiting)

    def generation(self, result: Generation) -> None:
        s = result.stats
        self.prompt_tokens.inc(result.prompt_tokens)
        self.completion_tokens.inc(s.predicted_n)
        self.drafted.inc(s.draft_n)
        self.accepted.inc(s.draft_n_accepted)
        self.drafted_by.labels("ngram").inc(s.draft_n_ngram)
        self.accepted_by.labels("ngram").inc(s.draft_n_matched_ngram)
        self.drafted_by.labels("head").inc(s.draft_n_head)
        self.accepted_by.labels("head").inc(s.draft_n_matched_head)
        self.drafted_by.labels("model").inc(s.draft_n - s.draft_n_ngram - s.draft_n_head)
        self.accepted_by.labels("model").inc(s.draft_n_accepted - s.draft_n_matched_ngram - s.draft_n_matched_head)
        self.kept.inc(s.arbiter_keeps)
        self.fallbacks.inc(s.target_fallbacks)
        if result.stop_reason == "aborted":
            self.aborted.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
