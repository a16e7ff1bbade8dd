"""Server URLs, said one way: a user may give `http://host:8000`, `.../` or `.../v1` for the same
OpenAI-compatible server, and every client joins its paths (`/v1/...`, `/metrics`) to the root."""

from __future__ import annotations

__all__ = ["server_root"]


def server_root(url: str) -> str:
    """The server's root: trailing slashes and one `/v1` dropped (`http://h:8000/v1/` ->
    `http://h:8000`)."""
    return url.rstrip("/").removesuffix("/v1")
