"""One reader of Prometheus samples, for both tiers: a gateway's `/metrics` over HTTP
(integration, browser), or this process's registry (unit tests over the app in process)."""

from __future__ import annotations

import httpx
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Every sample of an exposition, by name and label set."""


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str, key: str | None = None) -> Samples:
    """Every sample a gateway at `url` exposes now; read with `key` (an admin's or a
    scraper's, which a gateway with managed keys asks for)."""
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    response.raise_for_status()
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` with exactly `labels` (0 when there is none)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    wanted = set(labels.items())
    return sum(value for (n, have), value in samples.items() if n == name and wanted <= have)


def metric_value(url: str, name: str, **labels: str) -> float:
    """The sum of a gateway's samples of `name` that carry `labels`; fails the test when the
    gateway exposes no such sample at all (a renamed series must not read as zero)."""
    samples = scrape(url)
    wanted = set(labels.items())
    if not any(n == name and wanted <= have for n, have in samples):
        raise AssertionError(f"{name}{labels or ''} not in {url}/metrics")
    return total(samples, name, **labels)


def local_value(name: str, **labels: str) -> float:
    """A sample of this process's default registry (0 when it has not been observed yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
