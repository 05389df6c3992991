"""Scrape a gateway's /metrics and read it with prometheus_client's own parser.

s = scrape(url)
s.value("gateway_requests_total", status="200")   # sum over every series matching the labels
s.delta(before, "gateway_tokens_total", type="output")
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True)
class Scrape:
    samples: tuple[Sample, ...]
    content_type: str

    def value(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def delta(self, before: Scrape, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def label_values(self, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if label in s.labels}


def scrape(url: str) -> Scrape:
    return parse(httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False))


def parse(r: httpx.Response) -> Scrape:
    """A /metrics response read (for a test that scrapes often, through its own client)."""
    r.raise_for_status()
    samples = tuple(s for family in text_string_to_metric_families(r.text) for s in family.samples)
    return Scrape(samples, r.headers["content-type"])
