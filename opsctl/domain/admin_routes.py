"""vLLM's admin routes as the console calls them, and what an answer means. Pure.

Read from vLLM 0.32's source (vllm/entrypoints/launchers/api_server/routers.py and the
routers it registers), not guessed:

- always registered: ``GET /load``, ``GET /version`` (serve/instrumentator/basic.py);
- only with ``VLLM_SERVER_DEV_MODE=1`` in the server's environment
  (``register_vllm_dev_api_routers``): ``/server_info``, ``POST /reset_prefix_cache``,
  ``/reset_mm_cache``, ``/reset_encoder_cache``, ``POST /sleep``, ``POST /wake_up``,
  ``GET /is_sleeping``, ``/collective_rpc``; and, in the same ``if``,
  ``register_rl_api_routers``: ``POST /pause``, ``POST /resume``, ``GET /is_paused``;
- /sleep and /wake_up answer 200 on any platform, but only free and restore memory with
  ``--enable-sleep-mode`` on CUDA/ROCm/XPU (vLLM's CPU worker logs "sleep mode is not
  supported on CPU, ignore it"); /pause defaults to ``mode=abort``: in-flight requests
  are aborted.

A 404 on a route of this table is explained with the rule that registers it; the rule
comes from vLLM 0.32, and the explanation says so when the server reports another
version.
"""

from __future__ import annotations

from dataclasses import dataclass

RULES_FROM = "0.32"
DEV_ENV = "VLLM_SERVER_DEV_MODE=1"


@dataclass(frozen=True, slots=True)
class Route:
    """One admin route of vLLM's server: method, path, whether dev mode and a confirm are needed."""

    name: str
    method: str
    path: str
    dev: bool  # registered only with VLLM_SERVER_DEV_MODE=1
    destructive: bool  # changes what the server does: the console asks first
    what: str
    caveat: str = ""  # said with the question and after a success
    refused: str = ""  # why it may answer success=false


ROUTES: dict[str, Route] = {
    r.name: r
    for r in (
        Route("reset_prefix_cache", "POST", "/reset_prefix_cache", True, True,
              "drop the prefix cache",
              refused="vLLM refuses while requests hold cache blocks: retry when idle"),
        Route("reset_mm_cache", "POST", "/reset_mm_cache", True, True,
              "drop the multimodal processor cache"),
        Route("sleep", "POST", "/sleep?level=1", True, True,
              "put the engine to sleep (level 1: offload weights, drop KV cache)",
              "in-flight requests are aborted; memory is freed only with "
              "--enable-sleep-mode on CUDA/ROCm/XPU (the CPU worker ignores it)"),
        Route("wake_up", "POST", "/wake_up", True, False, "wake a sleeping engine"),
        Route("is_sleeping", "GET", "/is_sleeping", True, False, "is the engine asleep?"),
        Route("pause", "POST", "/pause", True, True, "pause generation",
              "mode=abort (vLLM's default): in-flight requests are aborted"),
        Route("resume", "POST", "/resume", True, False, "resume generation after a pause"),
        Route("is_paused", "GET", "/is_paused", True, False, "is generation paused?"),
        Route("server_info", "GET", "/server_info", True, False, "the server's config"),
        Route("load", "GET", "/load", False, False, "requests in flight (server load)"),
        Route("version", "GET", "/version", False, False, "vLLM version"),
    )
}  # fmt: skip


def route(name: str) -> Route:
    """The route named ``name`` (also spelled with dashes or a leading slash)."""
    key = name.strip().lstrip("/").replace("-", "_")
    if key not in ROUTES:
        raise KeyError(f"unknown admin route {name!r}; known: {', '.join(ROUTES)}")
    return ROUTES[key]


def explain_404(r: Route, version: str | None) -> str:
    """Why a server answered 404 for ``r``: the rule that registers it in vLLM."""
    where = f"{r.method} {r.path.split('?')[0]}"
    if r.dev:
        text = (
            f"{where} is a development route: vLLM {RULES_FROM} registers it only when the "
            f"server runs with {DEV_ENV} in its environment (restart it with that set)"
        )
    else:
        text = (
            f"{where} is registered by every vLLM {RULES_FROM} server: this one answered "
            "404, so it is not vLLM or not that version"
        )
    if version and not version.startswith(RULES_FROM):
        text += f" (rule read from vLLM {RULES_FROM}; this server reports vLLM {version})"
    return text


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an admin action did: whether it worked, in one line for the operator."""

    ok: bool
    text: str  # one line for the operator


def outcome(
    r: Route, status: int | None, body: object, error: str | None, version: str | None
) -> Outcome:
    """One line for an admin call's answer (``status`` None: no HTTP answer)."""
    where = f"{r.method} {r.path}"
    if status is None:
        return Outcome(False, f"{where}: no answer ({error or 'unreachable'})")
    if status == 404:
        return Outcome(False, explain_404(r, version))
    if status in (401, 403):
        return Outcome(False, f"{where}: HTTP {status}, the server wants an API key (--api-key)")
    if status != 200:
        detail = body.get("error") or body.get("detail") if isinstance(body, dict) else body
        return Outcome(False, f"{where}: HTTP {status} {str(detail or '')[:200]}".rstrip())
    if isinstance(body, dict) and body.get("success") is False:
        return Outcome(False, f"{where}: success=false ({r.refused or 'the server refused'})")
    shown = "ok" if body in (None, "", {}) else str(body)[:300]
    note = f"  note: {r.caveat}" if r.caveat else ""
    return Outcome(True, f"{where}: {shown}{note}")
