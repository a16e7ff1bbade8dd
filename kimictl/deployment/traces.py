"""Where a vLLM server sends its per-request trace spans: the `[metrics] traces` setting.

vLLM (`--otlp-traces-endpoint URL`) ends one span per finished request in its API-server
process and exports it through the OpenTelemetry SDK's batch processor (vllm/tracing/otel.py,
vllm/v1/engine/output_processor.py `do_tracing`). `kimictl monitor` receives them over OTLP/HTTP
(runtime/observe/otlp.py) on `DEFAULT_TRACES_PORT` unless told another port.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_TRACES_PORT",
    "INSTANCE_ATTRIBUTE",
    "KIMICTL",
    "OTEL_PACKAGES",
    "TRACES_PATH",
    "check_traces",
    "is_otlp_http",
    "shown",
    "kimictl_endpoint",
    "resolve_traces",
    "tracing_env",
]

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for traces
# kimictl's own port, beside (not on) an OpenTelemetry collector's 4318.
DEFAULT_TRACES_PORT = 14318
KIMICTL = "kimictl"
# The resource attribute that names the server a span came from: "HOST:PORT" of its API server.
INSTANCE_ATTRIBUTE = "service.instance.id"
# What vLLM imports to export spans (vllm/tracing/otel.py); without them it refuses to start.
OTEL_PACKAGES = (
    "opentelemetry-sdk",
    "opentelemetry-api",
    "opentelemetry-exporter-otlp",
)
# The SDK's batch processor sends every 5 s by default; half a second keeps the monitor's
# windows current at one small POST per interval with requests finishing.
_EXPORT_DELAY_MS = "500"


def kimictl_endpoint(port: int = DEFAULT_TRACES_PORT, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}{TRACES_PATH}"


def check_traces(value: object) -> str:
    """`[metrics] traces`: "kimictl", "off" or an http(s) URL (ValueError says what is allowed)."""
    allowed = f'"{KIMICTL}" (kimictl monitor on this host, port {DEFAULT_TRACES_PORT}), "off", '
    allowed += "or an http:// URL ending in /v1/traces"
    if not isinstance(value, str):
        raise ValueError(allowed)
    if value in (KIMICTL, "off"):
        return value
    parts = urlsplit(value)
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(allowed) from None
    if not parts.hostname or not is_otlp_http(value):
        raise ValueError(allowed)
    if parts.username is not None or parts.password is not None:
        # the URL is written into argv, renders, run records and `ps`: no place for a secret
        raise ValueError(
            "a URL without user:password@ (it would be written into every launch line, render "
            "and log); give the collector's credentials another way, e.g. OTEL_EXPORTER_OTLP_"
            "TRACES_HEADERS in the server's environment"
        )
    return value


def shown(url: str) -> str:
    """`url` fit to print: a user:password@ part replaced by ***@."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed [IPv6 bracket: no user part to find
        return url
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def is_otlp_http(endpoint: str | None) -> bool:
    """An OTLP/HTTP traces URL (a gRPC collector's address has no /v1/traces path)."""
    if not endpoint:
        return False
    parts = urlsplit(endpoint)
    return parts.scheme in ("http", "https") and parts.path.rstrip("/").endswith(TRACES_PATH)


def resolve_traces(value: str | None) -> str | None:
    """The `--otlp-traces-endpoint` URL for a checked `[metrics] traces` value (None = off)."""
    if value is None or value == "off":
        return None
    return kimictl_endpoint() if value == KIMICTL else value


def tracing_env(endpoint: str, *, host: str, port: int | None) -> dict[str, str]:
    """What vLLM's exporter needs beside the flag: OTLP/HTTP protobuf (vLLM's default is gRPC,
    which kimictl does not receive), a short export delay, and the server's name on each span."""
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": _EXPORT_DELAY_MS,
        "OTEL_SERVICE_NAME": "vllm",
    }
    if port is not None:
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"{INSTANCE_ATTRIBUTE}={host}:{port}"
    return env
