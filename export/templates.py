"""How a decoder's model card wants its text: the reranker's template and the embedder's
instruction format, written into the manifest (service/manifest.py) at export.

Reranker: Qwen3-Reranker's card, unless `--rerank-template FILE` gives another as JSON with the
keys `prefix`, `suffix`, `format` ({instruction}, {query}, {document}), `instruction` (the
default) and `yes`, `no` (the answer tokens whose logits are compared).

Embedder: the format a request's free instruction is put in, from the query prompt when it reads
"Instruct: <default instruction>\\nQuery:" (Qwen3-Embedding, and the e5-mistral/gte-Qwen family
it comes from), or `--instruction-format` ("Instruct: {instruction}\\nQuery:{text}").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

from service.manifest import RerankTemplate, check_format

QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@dataclass(frozen=True)
class TemplateSpec:
    """A rerank template before the answer tokens' ids are looked up in the vocabulary."""

    prefix: str
    suffix: str
    format: str
    instruction: str
    yes: str = "yes"
    no: str = "no"

    def __post_init__(self) -> None:
        check_format(self.format, ("instruction", "query", "document"), "the template's format")

    def with_ids(self, yes_id: int, no_id: int) -> RerankTemplate:
        return RerankTemplate(
            prefix=self.prefix,
            suffix=self.suffix,
            format=self.format,
            instruction=self.instruction,
            yes=self.yes,
            no=self.no,
            yes_id=yes_id,
            no_id=no_id,
        )


QWEN3_RERANKER = TemplateSpec(
    prefix=QWEN3_PREFIX,
    suffix=QWEN3_SUFFIX,
    format="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)


def read_template(path: Path) -> TemplateSpec:
    """A template file: JSON with the TemplateSpec's keys (yes and no default to "yes", "no")."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--rerank-template {path}: {exc}") from None
    known = {f.name for f in fields(TemplateSpec)}
    if not isinstance(raw, dict) or set(raw) - known:
        extra = sorted(set(raw) - known) if isinstance(raw, dict) else raw
        raise ValueError(
            f"--rerank-template {path}: unknown keys {extra}; known are {sorted(known)}"
        )
    required = {"prefix", "suffix", "format", "instruction"}
    if missing := sorted(required - set(raw)):
        raise ValueError(f"--rerank-template {path}: missing {missing}")
    if not all(isinstance(v, str) for v in raw.values()):
        raise ValueError(f"--rerank-template {path}: every value must be a string")
    return TemplateSpec(**raw)


# "Instruct: <instruction>\nQuery:" with whatever space the card puts around it.
INSTRUCT_PROMPT = re.compile(
    r"^(?P<head>\s*Instruct:\s*)(?P<instruction>.+?)(?P<tail>\n\s*Query:\s*)$", re.S
)
QUERY_PROMPTS = ("query", "search_query", "Query")


def instruction_format(prompts: dict[str, str], given: str | None = None) -> str | None:
    """The manifest's instruction format: `given` (checked), else derived from the query prompt
    in the Instruct/Query form, else None (the model takes no instruction)."""
    if given is not None:
        return check_format(given, ("instruction", "text"), "--instruction-format")
    for name in QUERY_PROMPTS:
        m = INSTRUCT_PROMPT.match(prompts.get(name, ""))
        if m:
            head, tail = (p.replace("{", "{{").replace("}", "}}") for p in m.group("head", "tail"))
            return f"{head}{{instruction}}{tail}{{text}}"
    return None
