"""The edge in front of an A/B pair: one plan for a live canary (a share of users to tuned) or a
shadow (a share of stock's requests copied to tuned, tuned's answers discarded), rendered as an
nginx config run on this machine here, and as a Gateway API HTTPRoute (render_k8s) for a cluster.

nginx (Debian's `nginx` / `nginx-light`, 1.22) does it with its own modules:
- canary: `split_clients` on `$request_id` (a fresh random id per request) picks the upstream, so
  the split is per request at the configured percentage (two decimals);
- shadow: `mirror` + `mirror_request_body` copy every request into an internal location; nginx has
  no mirror percentage, so a second `split_clients` on the same id decides, and the mirror
  location answers an unsampled copy itself (204) instead of sending it on. A mirror is a
  header-only subrequest: nginx closes its upstream at the response headers, which aborts a
  streamed completion on vLLM, unless the body is stored (`proxy_store`, one file overwritten);
- the edge id: `X-Request-Id: $request_id` on every proxied request, the same value on a request
  and its mirror (a subrequest shares its parent's variables), which vLLM reports as the span's
  request id (`cmpl-ID-0`, `chatcmpl-ID`): the live judge pairs by it.
What nginx cannot do: mirror and split at once here (one `--canary` or one `--shadow`); let a
mirror go: nginx finishes a request only after its mirror subrequest, so a slow shadow would hold
the next request on a kept-alive client connection; the shadow edge closes client connections
after each answer and drops a mirror silent for 30 s (docs/serve.md: measured).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kimictl.core.errors import InputError, LaunchError

__all__ = [
    "CANARY",
    "NGINX_PACKAGE",
    "SHADOW",
    "EdgePlan",
    "Proxy",
    "nginx_binary",
    "plan_edge",
    "render_nginx",
]

CANARY = "canary"
SHADOW = "shadow"
NGINX_PACKAGE = "nginx"  # Debian: `apt-get install nginx` (or nginx-light, which pulls it in)
MIRROR_TIMEOUT_S = 5  # the mirror's connect/send limit
MIRROR_READ_TIMEOUT_S = 30  # the longest silence of a mirrored stream: a hung shadow frees nginx


@dataclass(frozen=True, slots=True)
class EdgePlan:
    """Where the edge listens and how it sends requests to the two arms."""

    mode: str  # canary | shadow
    pct: float  # canary: share to tuned; shadow: share of stock's requests copied to tuned
    host: str
    port: int
    tuned: str  # host:port of the tuned server
    stock: str  # host:port of the stock server

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "pct": self.pct,
            "url": self.url,
            "tuned": self.tuned,
            "stock": self.stock,
        }


def _hostport(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 80}"


def plan_edge(
    *, canary: float | None, shadow: float | None, host: str, port: int, tuned: str, stock: str
) -> EdgePlan:
    """The edge for `serve --ab --canary PCT` or `--shadow PCT`; tuned and stock are URLs."""
    if canary is not None and shadow is not None:
        raise InputError(
            "--canary and --shadow at once: nginx here splits or mirrors one pair, not both; "
            "give one."
        )
    if canary is not None:
        if not 0 < canary < 100:
            raise InputError(
                f"--canary {canary:g} is out of range: the share of requests sent to tuned, "
                "more than 0 and less than 100 (percent)."
            )
        mode, pct = CANARY, canary
    elif shadow is not None:
        if not 0 < shadow <= 100:
            raise InputError(
                f"--shadow {shadow:g} is out of range: the share of requests copied to tuned, "
                "more than 0 and at most 100 (percent)."
            )
        mode, pct = SHADOW, shadow
    else:
        raise InputError("an edge needs --canary PCT or --shadow PCT.")
    if round(pct, 2) != pct:
        raise InputError(f"--{mode} {pct:g}: nginx splits in steps of 0.01%; round it.")
    return EdgePlan(mode, pct, host, port, _hostport(tuned), _hostport(stock))


def _pct(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") + "%"


def render_nginx(plan: EdgePlan, run_dir: Path) -> str:
    """A complete nginx.conf for the edge, every path inside `run_dir` (no root, no /etc)."""
    d = run_dir
    tmp = "\n".join(
        f"    {kind}_temp_path {d / 'tmp' / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    listen = f"[{plan.host}]:{plan.port}" if ":" in plan.host else f"{plan.host}:{plan.port}"
    proxied = """            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Request-Id $request_id;
            proxy_buffering off;
            proxy_read_timeout 3600s;
            add_header X-Request-Id $request_id always;"""
    if plan.mode == CANARY:
        split = f"""    split_clients "$request_id" $arm {{
        {_pct(plan.pct)} tuned;
        * stock;
    }}"""
        locations = f"""        location / {{
            proxy_pass http://$arm;
{proxied}
            add_header X-Kimictl-Arm $arm always;
        }}"""
    else:
        split = f"""    split_clients "$request_id" $mirrored {{
        {_pct(plan.pct)} yes;
        * "";
    }}"""
        # a request ends for nginx only when its mirror does: without client keep-alive the
        # client's next request takes a new connection instead of waiting behind the mirror
        locations = f"""        keepalive_timeout 0;
        location / {{
            mirror /_kimictl_mirror;
            mirror_request_body on;
            proxy_pass http://stock;
{proxied}
            add_header X-Kimictl-Arm stock always;
        }}
        location = /_kimictl_mirror {{
            internal;
            if ($mirrored = "") {{
                return 204;
            }}
            proxy_pass http://tuned$request_uri;
            # a mirror is a header-only subrequest: nginx would close tuned's connection at the
            # response headers, which aborts a streamed completion on vLLM; storing the body
            # (one file, overwritten) makes nginx read the stream to its end
            proxy_store {d / "mirror-last.out"};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Request-Id $request_id;
            proxy_connect_timeout {MIRROR_TIMEOUT_S}s;
            proxy_send_timeout {MIRROR_TIMEOUT_S}s;
            proxy_read_timeout {MIRROR_READ_TIMEOUT_S}s;
        }}"""
    # nginx started by root runs its workers as `nobody`, who cannot write the run folder (the
    # mirror's stored body); the edge runs as whoever runs kimictl, as the servers do
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""# kimictl edge ({plan.mode} {_pct(plan.pct)}): rendered by kimictl, do not edit
{user}daemon off;
worker_processes 1;
pid {d / "nginx.pid"};
error_log {d / "error.log"} warn;
events {{
    worker_connections 1024;
}}
http {{
    log_format kimictl '$msec $request_id $upstream_addr $status $request_time "$request"';
    access_log {d / "access.log"} kimictl;
{tmp}
    upstream tuned {{
        server {plan.tuned};
        keepalive 32;
    }}
    upstream stock {{
        server {plan.stock};
        keepalive 32;
    }}
{split}
    server {{
        listen {listen};
{locations}
    }}
}}
"""


def nginx_binary() -> str:
    """The nginx executable, or InputError naming the package to install."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise InputError(
            f"nginx is not installed; the edge of --canary/--shadow runs it: "
            f"apt-get install {NGINX_PACKAGE} (Debian's nginx-light works too)."
        )
    return found


class Proxy:
    """nginx with a rendered config, in its own process group, stopped with the pair."""

    def __init__(self, plan: EdgePlan, run_dir: Path) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.run_dir / "nginx.conf"

    def start(self, *, timeout: float = 10.0) -> Proxy:
        """Check the config (`nginx -t`), start it, wait until it accepts connections."""
        from kimictl.runtime.serving.plan import check_port_free

        binary = nginx_binary()
        check_port_free(self.plan.host, self.plan.port)
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.run_dir / "tmp" / kind).mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(render_nginx(self.plan, self.run_dir))
        argv = [binary, "-p", str(self.run_dir), "-c", str(self.config_path)]
        test = subprocess.run(
            [*argv, "-t", "-q"], capture_output=True, text=True, timeout=30, check=False
        )
        if test.returncode != 0:
            raise LaunchError(f"nginx refused the rendered config: {test.stderr.strip()}")
        log = (self.run_dir / "nginx.out").open("ab")
        self.process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        import socket

        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (self.run_dir / "error.log").read_text(errors="replace").strip()
                raise LaunchError(f"nginx exited at start ({self.process.returncode}): {err}")
            try:
                socket.create_connection((self.plan.host, self.plan.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise LaunchError(f"nginx did not listen on {self.plan.url} within {timeout:g} s")

    def stop(self, *, grace: float = 5.0) -> None:
        """SIGQUIT (graceful: finish what is in flight), SIGKILL after `grace`."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGQUIT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
