"""What a client may ask /explain of each model, checked before anything is tokenised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from service.errors import InvalidInput, WrongTask
from service.pipelines.explain.parts import Granularity

Form = Literal["input", "pair", "similarity"]
# What each task explains: an embedder one text or two texts' similarity, a reranker a pair,
# a classifier one text or a pair.
FORMS: dict[str, tuple[Form, ...]] = {
    "embed": ("input", "similarity"),
    "rerank": ("pair",),
    "classify": ("input", "pair"),
}
TASKS = {"embed": "an embedding model", "rerank": "a reranker", "classify": "a classifier"}
FORM_WORDS: dict[Form, str] = {
    "input": "`input` (one text)",
    "pair": "`pair` ([query, document])",
    "similarity": "`similarity` ([a, b])",
}
# What to send instead, when a model does not take a form.
INSTEAD: dict[str, dict[Form, str]] = {
    "embed": {"pair": "; for how similar two texts are, send similarity: [a, b]"},
    "rerank": {
        "input": "; it scores a pair: send pair: [query, document]",
        "similarity": "; it scores a pair: send pair: [query, document]",
    },
}


@dataclass(frozen=True)
class Question:
    form: Form
    texts: tuple[str, ...]  # one, or two (pair: query and document; similarity: a and b)
    granularity: Granularity = "token"
    target: str | None = None
    truncate: bool = True


def check_form(model: str, task: str, form: Form) -> None:
    """400 naming the forms the model takes, when it does not take this one."""
    if form in FORMS[task]:
        return
    takes = " or ".join(FORM_WORDS[f] for f in FORMS[task])
    raise WrongTask(
        f"model {model!r} is {TASKS[task]}: it explains {takes}, not {FORM_WORDS[form]}"
        f"{INSTEAD.get(task, {}).get(form, '')}",
        param=form,
    )


def check_target(model: str, task: str, target: str | None, labels: Sequence[str]) -> None:
    """422: a target for a model without labels, or one that is not among them (listed)."""
    if target is None:
        return
    if task != "classify":
        raise InvalidInput(
            f"target names a classifier's label; model {model!r} is {TASKS[task]}",
            param="target",
        )
    if target not in labels:
        raise InvalidInput(
            f"target {target!r} is not one of the model's labels: {', '.join(labels)}",
            param="target",
        )
