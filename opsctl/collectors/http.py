"""Where opsctl's HTTP requests to a vLLM server get their credentials and auth errors.

- :func:`client` returns an ``httpx.Client`` that sends ``Authorization: Bearer KEY``
  on every request when a key is given (vLLM guards ``/v1/...`` with ``--api-key`` /
  ``VLLM_API_KEY``; ``/health``, ``/metrics`` and ``/version`` stay open).
- :func:`auth_error` / :func:`check_auth`: a 401 or 403 answer means "authentication
  required" (exit 3, like an unreachable server: opsctl cannot look inside it), never a
  crash or a failed check.
- :func:`require_reachable`: the first contact of every URL diag; no answer, a
  non-vLLM HTTP server and a refused key are exit 3 (docs/cli.md, exit codes).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import ssl
from collections.abc import Iterator

import httpx

from opsctl.errors import BadInput, EngineUnreachable

AUTH_STATUSES = (401, 403)
ENV_API_KEY = "VLLM_API_KEY"  # the same variable vLLM itself reads
_DEFAULT = httpx.Timeout(5.0)  # httpx's own default; None would mean "no timeout"
# vLLM's server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default,
# httpx's own expiry too). A client reusing one just as the server closes it reads
# ReadError('') or RemoteProtocolError: a false "unreachable" or a failed request. Every
# opsctl client drops idle connections well before the server's timeout instead.
KEEPALIVE_EXPIRY_S = 2.0


def limits(connections: int, keepalive: int | None = None) -> httpx.Limits:
    """Pool limits with opsctl's keep-alive expiry."""
    return httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections if keepalive is None else keepalive,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )


# vLLM's header that sends a request to one data-parallel engine (a router's pin; 0.32:
# entrypoints/generate/base/serving.py _get_data_parallel_rank)
DP_RANK_HEADER = "X-data-parallel-rank"
_ROUTE: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "opsctl_route", default=()
)


@contextlib.contextmanager
def pinned_to_engine(rank: int | None) -> Iterator[None]:
    """Send the requests of every :func:`client` made in the block to one DP engine.

    Data-parallel engine ``rank``, through vLLM's ``X-data-parallel-rank`` header; None
    pins nothing."""
    token = _ROUTE.set(() if rank is None else ((DP_RANK_HEADER, str(rank)),))
    try:
        yield
    finally:
        _ROUTE.reset(token)


def headers(api_key: str | None) -> dict[str, str]:
    """The Authorization header for ``api_key`` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client of this process.

    httpx builds one per client by default, loading the CA bundle each time (about 150 ms
    holding the GIL here, ~10 clients per target in certify's checks: most of a fleet's time
    at 16 targets)."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def client(
    api_key: str | None = None, timeout: float | httpx.Timeout | None = _DEFAULT, **kwargs
) -> httpx.Client:
    """An httpx.Client for one vLLM server, carrying its API key (if any)."""
    kwargs.setdefault("limits", limits(100, 20))  # httpx's default pool sizes
    kwargs.setdefault("verify", tls_context())
    return httpx.Client(
        timeout=timeout, headers={**headers(api_key), **dict(_ROUTE.get())}, **kwargs
    )


def default_api_key() -> str | None:
    """The API key in ``VLLM_API_KEY`` (the variable vLLM reads); None when unset."""
    return os.environ.get(ENV_API_KEY) or None


def auth_error(url: str, status: int, api_key: str | None) -> EngineUnreachable:
    """The typed "authentication required" error for a 401/403 answer from ``url``."""
    if api_key:
        hint = "the server refused the API key given (--api-key / VLLM_API_KEY)"
    else:
        hint = "pass --api-key KEY (or set VLLM_API_KEY)"
    return EngineUnreachable(f"authentication required: {url} answered HTTP {status}", hint=hint)


def check_auth(response: httpx.Response, api_key: str | None = None) -> httpx.Response:
    """``response`` unchanged, or the typed "authentication required" error for 401/403."""
    if response.status_code in AUTH_STATUSES:
        req = response.request
        where = f"{req.url.scheme}://{req.url.netloc.decode()}{req.url.path}"
        raise auth_error(where, response.status_code, api_key)
    return response


def require_reachable(url: str, timeout: float = 5.0, api_key: str | None = None) -> None:
    """Check that a vLLM server answers at ``url`` and accepts our credentials.

    Else EngineUnreachable (exit 3): "no server answered" (refused, no connection or no HTTP
    answer within ``timeout``), "not a vLLM server" (an HTTP server whose /health or /v1/models
    is not vLLM's) or "authentication required" (401/403 on the guarded /v1/models). A URL httpx
    cannot use is BadInput (exit 2)."""
    try:
        with client(api_key, timeout=timeout) as c:
            health = c.get(f"{url}/health")
            models = check_auth(c.get(f"{url}/v1/models"), api_key)
    except httpx.ConnectTimeout:
        raise EngineUnreachable(
            f"no server answered at {url}: no connection within {timeout:g} s"
        ) from None
    except httpx.TimeoutException:
        raise EngineUnreachable(
            f"no server answered at {url}: connected, but no HTTP answer within {timeout:g} s"
        ) from None
    except httpx.InvalidURL as exc:
        raise BadInput(f"not a valid URL: {url!r} ({exc})") from None
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"no server answered at {url}: {type(exc).__name__}") from None
    if health.status_code == 404 or not lists_models(models):
        raise EngineUnreachable(
            f"not a vLLM server at {url}: /health answered HTTP {health.status_code}, "
            f"/v1/models HTTP {models.status_code}"
            + ("" if models.status_code != 200 else " without a model list"),
            hint="give the base URL of a vLLM server (where /health and /v1/models answer)",
        )


def lists_models(response: httpx.Response) -> bool:
    """``response`` is an OpenAI-style model list (vLLM's /v1/models)."""
    if response.status_code != 200:
        return False
    try:
        doc = response.json()
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("data"), list)
