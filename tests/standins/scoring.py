"""A stand-in cross-encoder scoring server for diag usage's tests.

A stand-in scoring server for diag usage's tests: a cross-encoder whose "tokenizer"
splits on whitespace and adds the special tokens of a tokenizer family, and whose
/score and /rerank report usage = the true pair count + ``inflate`` (so the check can be
proved to fail)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.standins.base import StandInVllm, serving

# special tokens around one text, and the true pair template, per tokenizer family
STYLES = {
    "bert": (["[CLS]"], ["[SEP]"], ["[SEP]"]),  # [CLS] q [SEP] d [SEP]
    "roberta": (["<s>"], ["</s>"], ["</s>", "</s>"]),  # <s> q </s></s> d </s>
    "odd": (["<bos>"], ["<eos>"], ["<sep>"]),  # unknown family: not derivable
}


def toks(text: str, special: bool, style: str = "bert") -> list[str]:
    """The stand-in tokenizer: the words of ``text``, with the special tokens if asked."""
    words = text.split()
    prefix, suffix, _ = STYLES[style]
    return [*prefix, *words, *suffix] if special else words


def pair_toks(q: str, d: str, style: str = "bert") -> list[str]:
    """The tokens of one (query, document) pair in the family's pair template."""
    prefix, suffix, sep = STYLES[style]
    return [*prefix, *q.split(), *sep, *d.split(), *suffix]


@contextmanager
def stand_in(
    inflate: int = 0,
    score_status: int = 200,
    style: str = "bert",
    sleep: float = 0.0,
    root: str | None = None,
    generative: bool = False,
    gate: threading.Event | None = None,
) -> Iterator[str]:
    """Serve a fake cross-encoder; yields its URL.

    A fake cross-encoder server: whitespace 'tokenizer' of the given family; usage =
    true pair count + inflate; ``sleep`` delays /score and /rerank answers, ``gate``
    holds them until it is set (at most a minute)."""

    class H(StandInVllm):
        def models(self) -> list[dict]:
            return [{"id": "fake-reranker", "root": root}]

        def metrics_text(self) -> None:
            return None

        VERSION = None

        def post(self, path: str, body: dict) -> bool:
            if path == "/tokenize":
                t = toks(body["prompt"], body.get("add_special_tokens", True), style)
                self._send(200, {"count": len(t), "tokens": list(range(len(t))), "token_strs": t})
            elif path == "/classify" and not generative:
                self._send(200, {"data": []})
            elif path in ("/score", "/rerank") and not generative:
                time.sleep(sleep)
                if gate is not None:
                    gate.wait(60)
                if score_status != 200:
                    self._send(score_status, {"detail": "Not Found"})
                    return True
                q = body.get("text_1", body.get("query"))
                d = body.get("text_2", body.get("documents"))
                qs = q if isinstance(q, list) else [q]
                ds = d if isinstance(d, list) else [d]
                if len(qs) == 1:
                    qs = qs * len(ds)
                n = sum(len(pair_toks(a, b, style)) for a, b in zip(qs, ds, strict=True)) + inflate
                usage = {"prompt_tokens": n, "total_tokens": n}
                if path == "/score":
                    self._send(
                        200,
                        {
                            "data": [{"index": i, "score": 0.5} for i in range(len(ds))],
                            "usage": usage,
                        },
                    )
                else:
                    top = body.get("top_n") or len(ds)
                    self._send(
                        200,
                        {
                            "results": [{"index": i, "relevance_score": 0.5} for i in range(top)],
                            "usage": usage,
                        },
                    )
            else:
                return False
            return True

    with serving(H) as url:
        yield url
