"""`serve --ab --canary PCT|--shadow PCT --render k8s`: both deployments and a Gateway API
HTTPRoute, every object validated against its vendored schema (tests/k8s_schemas.py; the HTTPRoute
against Gateway API v1.6.1's standard-channel CRD), and the route's CEL rules checked by hand."""

from __future__ import annotations

from typing import Any

import k8s_schemas
import pytest
import yaml

from kimictl.cli import main


def _render(capsys: pytest.CaptureFixture[str], *flags: str) -> list[dict[str, Any]]:
    args = ["serve", "k3-tp8-latency", "--ab", *flags, "--render", "k8s"]
    assert (
        main([*args, "--api-key-secret", "vllm-key", "--traces", "http://otel:4318/v1/traces"]) == 0
    )
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def _route(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (route,) = [d for d in docs if d["kind"] == "HTTPRoute"]
    return route


@pytest.mark.parametrize(
    "flags", [("--canary", "10"), ("--canary", "12.5"), ("--shadow", "100"), ("--shadow", "7.25")]
)
def test_every_object_validates(capsys: pytest.CaptureFixture[str], flags: tuple[str, str]) -> None:
    docs = _render(capsys, *flags)
    for obj in docs:
        assert k8s_schemas.errors(obj) == [], (obj["kind"], k8s_schemas.errors(obj))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("LeaderWorkerSet") == 2 and kinds.count("HTTPRoute") == 1
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    rule = _route(docs)["spec"]["rules"][0]
    refs = rule["backendRefs"] + [f["requestMirror"]["backendRef"] for f in rule.get("filters", [])]
    for ref in refs:  # every backend is a Service the render wrote, on the port it serves
        assert ref["port"] == services[ref["name"]]["spec"]["ports"][0]["port"]


def test_canary_weights_are_the_split(capsys: pytest.CaptureFixture[str]) -> None:
    refs = _route(_render(capsys, "--canary", "12.5"))["spec"]["rules"][0]["backendRefs"]
    weights = {r["name"]: r["weight"] for r in refs}
    assert weights == {"k3-tp8-latency-leader": 1250, "k3-tp8-latency-stock-leader": 8750}


@pytest.mark.parametrize(
    ("pct", "field", "value"),
    [
        ("100", None, None),
        ("10", "percent", 10),
        ("7.25", "fraction", {"numerator": 725, "denominator": 10000}),
    ],
)
def test_shadow_mirrors_by_percent_or_fraction(
    capsys: pytest.CaptureFixture[str], pct: str, field: str | None, value: object
) -> None:
    rule = _route(_render(capsys, "--shadow", pct))["spec"]["rules"][0]
    (mirror,) = [f["requestMirror"] for f in rule["filters"] if f["type"] == "RequestMirror"]
    assert mirror["backendRef"]["name"] == "k3-tp8-latency-leader"
    assert [r["name"] for r in rule["backendRefs"]] == ["k3-tp8-latency-stock-leader"]
    # the CRD's CEL rule (not run by jsonschema): percent and fraction are exclusive
    assert not ("percent" in mirror and "fraction" in mirror)
    if field is None:
        assert "percent" not in mirror and "fraction" not in mirror  # neither = 100%
    else:
        assert mirror[field] == value
        if field == "fraction":  # CEL: numerator <= denominator
            assert value["numerator"] <= value["denominator"]  # type: ignore[index]


def test_each_arm_names_itself_on_its_spans(capsys: pytest.CaptureFixture[str]) -> None:
    docs = _render(capsys, "--canary", "10")
    for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
        pod = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        role = "stock" if lws["metadata"]["name"].endswith("-stock") else "tuned"
        assert env["OTEL_SERVICE_NAME"] == lws["metadata"]["name"]
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"service.instance.id={role}"


def test_a_route_the_gateway_api_refuses_fails_validation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    route = _route(_render(capsys, "--canary", "10"))
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    assert k8s_schemas.errors(route)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--canary", "10", "--render", "slurm"], "render as a Kubernetes HTTPRoute"),
        (["--shadow", "0", "--render", "k8s"], "--shadow 0 is out of range"),
        (["--canary", "10", "--shadow", "10", "--render", "k8s"], "at once"),
        (["--canary", "10", "--gateway", "Bad_Name", "--render", "k8s"], "cannot name"),
    ],
)
def test_bad_route_input_is_one_sentence(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    message: str,
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "not-a-real-key")
    args = ["serve", "k3-tp8-latency", "--ab", *flags, "--traces", "off"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
