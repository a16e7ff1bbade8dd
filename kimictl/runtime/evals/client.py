"""A small synchronous client for the vLLM OpenAI-compatible endpoints the checks need.

All prompts are sent as token ids (tokenized once on the reference), so candidate and reference see
byte-identical inputs and prompt lengths are exact. HTTP and transport errors become
`EndpointError` here, naming the endpoint, the path and the server's own message.
"""

from __future__ import annotations

import json
from typing import Any

from kimictl.core.apikeys import env_api_key
from kimictl.core.errors import EndpointError, InputError
from kimictl.core.http1 import BlockingClient, own_request_headers
from kimictl.core.urls import server_root

__all__ = ["Endpoint", "token_id"]


def token_id(token: str) -> int:
    """'token_id:123' (vLLM's return_tokens_as_token_ids form) -> 123."""
    if not token.startswith("token_id:"):
        raise EndpointError(f"expected a token in the form 'token_id:N', got {token!r}")
    return int(token.split(":", 1)[1])


class Endpoint:
    """One OpenAI-compatible vLLM server: `url` is the base (with or without /v1)."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "",
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        base = server_root(url)
        if not base.startswith(("http://", "https://")):
            raise InputError(
                f"endpoint URL {url!r} must start with http:// or https://",
                hint="pass e.g. --candidate http://127.0.0.1:8000 or a run id from `kimictl ps`",
            )
        self.base = base
        self.name = name or base
        self._api_key = api_key if api_key is not None else env_api_key()
        self._timeout_s = timeout_s
        self._client = BlockingClient()
        self._model = model
        self._max_model_len: int | None = None
        # sequences this client asked for (a request with n=k is k sequences, as vLLM counts them)
        self.sequences_requested = 0

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        try:
            status, raw = self._client.request(
                self.base,
                method,
                path,
                body=data,
                api_key=self._api_key,
                timeout=self._timeout_s,
                headers=own_request_headers("validate") if body is not None else None,
            )
        except TimeoutError as exc:
            raise EndpointError(
                f"{self.name}: {path} timed out (no whole answer within {self._timeout_s:g} s)",
                hint="is the server overloaded or hung? see `kimictl logs`",
            ) from exc
        except OSError as exc:
            raise EndpointError(
                f"{self.name}: cannot reach {self.base}{path} ({type(exc).__name__}: {exc})",
                hint="is the server running? `kimictl ps` lists launched servers",
            ) from exc
        text = raw.decode(errors="replace")
        if status >= 400:
            detail = text[:300].replace("\n", " ")
            try:
                payload = json.loads(text)
                err = payload.get("error", payload)
                detail = str(err.get("message", err)) if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                pass
            from kimictl.core.apikeys import auth_hint

            raise EndpointError(
                f"{self.name}: {path} answered HTTP {status}: {detail}",
                hint=auth_hint(status, key_sent=bool(self._api_key)),
            )
        try:
            return json.loads(text)
        except ValueError as exc:
            raise EndpointError(f"{self.name}: {path} answered non-JSON: {text[:200]!r}") from exc

    def _load_model(self) -> None:
        data = self._request("GET", "/v1/models").get("data") or []
        if not data:
            raise EndpointError(f"{self.name}: /v1/models lists no model")
        card = data[0]
        if self._model is not None:
            matches = [c for c in data if c.get("id") == self._model]
            if not matches:
                served = ", ".join(str(c.get("id")) for c in data)
                raise InputError(
                    f"{self.name} does not serve model {self._model!r} (it serves {served})"
                )
            card = matches[0]
        self._model = str(card["id"])
        if card.get("max_model_len") is None:
            raise EndpointError(f"{self.name}: /v1/models gives no max_model_len (is this vLLM?)")
        self._max_model_len = int(card["max_model_len"])

    @property
    def model(self) -> str:
        if self._model is None or self._max_model_len is None:
            self._load_model()
        assert self._model is not None
        return self._model

    @property
    def max_model_len(self) -> int:
        if self._max_model_len is None:
            self._load_model()
        assert self._max_model_len is not None
        return self._max_model_len

    def finished_requests(self) -> float | None:
        """vLLM's cumulative finished-request counter from /metrics; None when unavailable."""
        from kimictl.runtime.observe.names import REQUEST_SUCCESS
        from kimictl.runtime.observe.scrape import scrape_once

        try:
            snap = scrape_once(
                self.base,
                names=(REQUEST_SUCCESS + "_total",),
                api_key=self._api_key,
                timeout=30.0,
                name=self.name,
            )
        except EndpointError:
            return None
        return snap.counters.get(REQUEST_SUCCESS)

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        return [int(t) for t in self._request("POST", "/tokenize", body)["tokens"]]

    def complete(self, prompt: list[int], **params: Any) -> dict[str, Any]:
        """POST /v1/completions with a token-id prompt; returns the response JSON."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "stream": False}
        body.update(params)
        self.sequences_requested += int(params.get("n", 1))
        result: dict[str, Any] = self._request("POST", "/v1/completions", body)
        if not result.get("choices"):
            raise EndpointError(f"{self.name}: /v1/completions answered no choices")
        return result
