"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own so that servers in one process do not
share counts."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine.stats import SpecStats

_TIMES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Requests by outcome, tokens, rows in flight, requests waiting, speculation's accepted length and step times."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vlmspec_requests", "Chat completion requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("vlmspec_prompt_tokens", "Prompt tokens of answered choices", registry=r)
        self.completion_tokens = Counter(
            "vlmspec_completion_tokens", "Tokens generated for answered choices", registry=r
        )
        self.rows_in_flight = Gauge("vlmspec_rows_in_flight", "Sequences decoding now", registry=r)
        self.queue_length = Gauge(
            "vlmspec_queue_length",
            "Choices accepted and not decoding yet (media being read, or waiting for a row)",
            registry=r,
        )
        self.steps = Counter("vlmspec_steps", "Decoding steps of finished sequences (each sequence's own)", registry=r)
        self.plain_steps = Counter(
            "vlmspec_plain_steps", "Steps of finished sequences that drafted nothing (drafts did not pay)", registry=r
        )
        self.accepted = Counter("vlmspec_accepted_draft_tokens", "Draft tokens the target accepted", registry=r)
        self.mean_accepted = Gauge(
            "vlmspec_mean_accepted_length",
            "Accepted draft tokens per drafting step, over every finished sequence",
            registry=r,
        )
        self.mean_accepted.set_function(self._mean_accepted)
        self.step_seconds = Histogram(
            "vlmspec_step_seconds",
            "Time of each decoding step, as each finished sequence saw it",
            buckets=_TIMES,
            registry=r,
        )
        self.first_token_seconds = Histogram(
            "vlmspec_time_to_first_token_seconds",
            "From a request's arrival to its first token",
            buckets=_TIMES,
            registry=r,
        )
        self._lock = threading.Lock()
        self._steps = 0
        self._accepted = 0

    def _mean_accepted(self) -> float:
        with self._lock:
            return self._accepted / self._steps if self._steps else 0.0

    def sequence_finished(self, stats: SpecStats | None) -> None:
        """Book a finished sequence's steps (the target alone reports none)."""
        if stats is None:
            return
        accepted, plain = sum(step.accepted for step in stats.steps), stats.plain_steps
        with self._lock:
            self._steps += len(stats.steps) - plain
            self._accepted += accepted
        self.steps.inc(len(stats.steps))
        self.plain_steps.inc(plain)
        self.accepted.inc(accepted)
        for step in stats.steps:
            self.step_seconds.observe(step.seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
