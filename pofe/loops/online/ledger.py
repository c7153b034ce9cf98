"""The training ledger (``<run_dir>/ledger.jsonl``): every annotation a run trained on (or
skipped), appended the moment it exists, and every trained pair's loss. One JSON object a
line; ``kind`` says which schema the row follows.

``kind: "annotation"`` -- one judged (or skipped) pair of sampled responses::

    pair_id        str    "s<step>-r<rank>-<i>", unique in the run
    step, rank     int    optimiser step that sampled it; data-parallel process
    prompt_id      str|None
    prompt         str    the prompt text
    response_a/_b  str    the two sampled responses (A is the first order shown)
    len_a/_b       int    their length in tokens
    p              float|None  P(A better), position-debiased; None = unreadable (never invented)
    p_ab, p_ba     float|None  P(A better) read in order (A, B) and in order (B, A)
    consistent     bool|None   both orders prefer the same response
    parse_ok       bool|None   at least one order was read
    text_fallback  bool   the endpoint returned no logprobs; the verdict was read as text (a hard 0/1)
    judge_id, template_id, template_hash, principle_id, constitution_version: str|None
    judge_tokens   int    tokens the judge used for this pair (both orders)
    cached         bool   served from the judge cache
    latency_s      float
    errors         list|str|None  what the judge could not read, as it reported it
    status         str    trained | identical | unlabelled | ties | inconsistent | low_margin | ranking
    selected       bool   False: a round-robin comparison used only to rank n > 2 samples

``kind: "loss"`` -- one trained pair after its update::

    pair_id  str    the annotation it came from
    step     int
    loss     float  the DAP loss of the pair (OAIF Eq. 1-3)
    margin   float  beta * h, the implicit reward margin
    p        float  the target trained towards (1.0 for hard labels)

The ledger is an append-only output of the driver (``OnlineRecipe.outputs``): every checkpoint
records its size, and a resumed run moves rows written after it to
``ledger.after-crash-<time>.jsonl`` (kept, never deleted) so the ledger never holds a row twice.
"""

from __future__ import annotations

from typing import Any

ANNOTATION_STATUSES = ("trained", "identical", "unlabelled", "ties", "inconsistent", "low_margin", "ranking")


def annotation_row(*, pair_id: str, step: int, rank: int, prompt, a, b, judgment, status: str,
                   selected: bool) -> dict[str, Any]:
    """A ``kind: "annotation"`` row (schema above)."""
    j = judgment
    row = {
        "kind": "annotation", "pair_id": pair_id, "step": step, "rank": rank,
        "prompt_id": prompt.id, "prompt": prompt.text, "response_a": a.text, "response_b": b.text,
        "len_a": a.num_tokens, "len_b": b.num_tokens,
        "p": None, "p_ab": None, "p_ba": None, "consistent": None, "parse_ok": None, "text_fallback": False,
        "judge_id": None, "template_id": None, "template_hash": None, "principle_id": None,
        "constitution_version": None, "judge_tokens": 0, "cached": False, "latency_s": None, "errors": None,
        "status": status, "selected": selected,
    }
    if j is not None:
        row.update(p=j.p, p_ab=j.p_ab, p_ba=j.p_ba, consistent=j.consistent, parse_ok=j.parse_ok,
                   text_fallback=bool(j.hard_label_fallback), judge_id=j.judge_id, template_id=j.template_id,
                   template_hash=j.template_hash, principle_id=j.principle_id,
                   constitution_version=j.constitution_version, judge_tokens=int(j.tokens or 0), cached=j.cached,
                   latency_s=round(j.latency_s, 4), errors=j.extra.get("errors", j.extra.get("error")))
    return row


def loss_row(ps, step: int) -> dict[str, Any]:
    """A ``kind: "loss"`` row from a :class:`pofe.loops.online.dap.PairStats`."""
    return {"kind": "loss", "pair_id": ps.pair_id, "step": step, "loss": ps.loss, "margin": ps.margin, "p": ps.p}
