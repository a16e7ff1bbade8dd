"""One server root for every spelling of a server's URL, in every client that joins paths to it."""

from __future__ import annotations

import pytest

from kimictl.core import http1
from kimictl.core.urls import server_root
from kimictl.runtime.evals.client import Endpoint as EvalsEndpoint
from kimictl.runtime.observe.scrape import metrics_url
from kimictl.runtime.serving.runs import resolve_target

SPELLINGS = ["http://10.0.0.5:8000", "http://10.0.0.5:8000/", "http://10.0.0.5:8000/v1",
             "http://10.0.0.5:8000/v1/"]  # fmt: skip


@pytest.mark.parametrize("url", SPELLINGS)
def test_every_client_reads_the_same_root(url: str) -> None:
    root = "http://10.0.0.5:8000"
    assert server_root(url) == root
    assert resolve_target(url).url == root
    assert EvalsEndpoint(url, api_key="k").base == root
    assert metrics_url(url) == root + "/metrics"
    endpoint = http1.Endpoint(url, api_key=None)
    assert (endpoint.host, endpoint.port, endpoint.prefix) == ("10.0.0.5", 8000, "")


def test_a_path_prefix_is_kept_and_only_one_v1_dropped() -> None:
    assert server_root("https://gw.example/k3/v1/") == "https://gw.example/k3"
    assert server_root("http://h:1/v1/v1") == "http://h:1/v1"
    assert http1.Endpoint("https://gw.example/k3/v1", api_key=None).prefix == "/k3"
    assert metrics_url("http://h:1/metrics") == "http://h:1/metrics"
