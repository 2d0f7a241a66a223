"""Token counts of `diag usage` engine inputs, from the server's /tokenize.

Which texts to ask for, and the pair template that joins a query and a document.

A pair's special tokens depend on the tokenizer: BERT builds ``[CLS] q [SEP] d [SEP]``,
RoBERTa / XLM-R build ``<s> q </s></s> d </s>``. The template is inferred from the
special tokens /tokenize adds around ONE text (:func:`inferred_template`); an unknown
family gives no template, and then a pair's count is not derivable (None). Pure: the
lengths are collected first (opsctl.collectors.scoring) and come in as numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsctl.suite.usage.judge import CROSS, Input

# Pair templates as (name, how many times the single-text suffix separates q from d):
# the pair is ``prefix q suffix*sep_repeat d suffix``. Keyed by the special tokens the
# tokenizer adds around ONE text, as /tokenize shows them.
PAIR_TEMPLATES: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, int]] = {
    (("[CLS]",), ("[SEP]",)): ("bert: [CLS] q [SEP] d [SEP]", 1),
    (("<s>",), ("</s>",)): ("roberta: <s> q </s></s> d </s>", 2),
}


@dataclass(frozen=True, slots=True)
class PairTemplate:
    """The special tokens a tokenizer family puts around a (query, document) pair."""

    name: str
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    sep_repeat: int

    @property
    def specials(self) -> int:
        """Special tokens a pair gets: prefix + separator(s) + final suffix."""
        return len(self.prefix) + len(self.suffix) * (self.sep_repeat + 1)

    def count(self, query_tokens: int, document_tokens: int) -> int:
        """Length of ``tokenizer(text=q, text_pair=d)`` from the two texts' own lengths.

        Both texts are tokenized alone (without specials) and joined by the template's
        special tokens.
        """
        return query_tokens + document_tokens + self.specials


def pair_template(prefix: list[str], suffix: list[str]) -> PairTemplate | None:
    """The pair template of a tokenizer that adds ``prefix``/``suffix`` around one text.

    None when it is not a known family (then the pair count is not derivable).
    """
    known = PAIR_TEMPLATES.get((tuple(prefix), tuple(suffix)))
    if known is None:
        return None
    return PairTemplate(known[0], tuple(prefix), tuple(suffix), known[1])


def special_affixes(with_specials: list[str], without: list[str]) -> tuple[list[str], list[str]]:
    """Split the special tokens a tokenizer adds around a single text into (prefix, suffix)."""
    n = len(without)
    for start in range(len(with_specials) - n + 1):
        if with_specials[start : start + n] == without:
            return with_specials[:start], with_specials[start + n :]
    raise ValueError(
        "tokens without specials are not a contiguous part of the tokens with specials"
    )


def tokenize_requests(
    inputs: Sequence[Input], template: PairTemplate | None
) -> tuple[tuple[str, bool], ...]:
    """The (text, add_special_tokens) the server must tokenize to count ``inputs``.

    A text with its special tokens; each side of a pair without (joined by ``template``; a pair
    is not counted at all when the template is unknown).
    """
    out: dict[tuple[str, bool], None] = {}
    for x in inputs:
        if isinstance(x, tuple):
            if template is not None:
                out[(x[0], False)] = out[(x[1], False)] = None
        else:
            out[(x, True)] = None
    return tuple(out)


def remote_parts(
    inputs: Sequence[Input],
    lengths: Mapping[tuple[str, bool], int],
    template: PairTemplate | None,
) -> tuple[int | None, ...]:
    """Each input's count from /tokenize ``lengths``; None for a pair of unknown template.

    ``lengths`` keyed as :func:`tokenize_requests` asks.
    """
    out: list[int | None] = []
    for x in inputs:
        if not isinstance(x, tuple):
            out.append(lengths[(x, True)])
        elif template is None:
            out.append(None)
        else:
            out.append(template.count(lengths[(x[0], False)], lengths[(x[1], False)]))
    return tuple(out)


def inferred_template(with_specials: list[str], without: list[str]) -> PairTemplate | None:
    """The pair template from one probe text tokenized with and without special tokens."""
    try:
        prefix, suffix = special_affixes(with_specials, without)
    except ValueError:
        return None
    return pair_template(prefix, suffix)


def remote_method(kind: str, template: PairTemplate | None) -> str:
    """How the count was derived, for the report: which /tokenize requests."""
    if kind != CROSS:
        return "/tokenize of each text"
    if template is None:
        return "/tokenize (pair template unknown)"
    return f"/tokenize of q and d + {template.name}"


def local_method(kind: str, model_dir: str) -> str:
    """How the local tokenizer counts: exactly vLLM's call (scoring io_processor)."""
    call = "tokenizer(text=q, text_pair=d)" if kind == CROSS else "tokenizer(text)"
    return f"local {call} from {model_dir}"
