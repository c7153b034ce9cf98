"""A reward model as annotator: the paper's "online DPO with an RM" baseline (OAIF Sec. 4.3).

A sequence-classification model scores each response on its own, r(x, y); the pairwise
preference is the Bradley-Terry probability

    P(A > B | x) = sigma(r(x, A) - r(x, B)),

the same model an RM is trained under (the RLHF baseline of OAIF Sec. 2). Position bias
does not exist for a pointwise scorer, so both "orders" are the same number and every
verdict is consistent; responses of a pair are scored in one batch.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from pofe.judges.base import Capability, JudgeConfigError, check_batch
from pofe.records import Judgment, Score


class RewardModelJudge:
    """Pairwise and pointwise judge over a sequence-classification reward model.

    Args:
        model_name: embedded name, Hugging Face id or local directory of an
            ``AutoModelForSequenceClassification`` checkpoint with one output (a scalar reward).
        model, tokenizer: an already loaded reward model to use instead.
        batch_size: (prompt, response) rows per forward pass.
        max_length: truncate rows longer than this many tokens (from the left, keeping the response).
    """

    capabilities = frozenset({Capability.PAIRWISE, Capability.POINTWISE})

    def __init__(self, model_name: str | None = None, *, model=None, tokenizer=None, batch_size: int = 16,
                 max_length: int | None = 2048, dtype: str = "float32", device: str | None = None,
                 trust_remote_code: bool = False):
        if model is None:
            if not model_name:
                raise JudgeConfigError("reward-model judge: set judge.reward_model to a sequence-classification checkpoint")
            from transformers import AutoModelForSequenceClassification

            from pofe.models import load_model

            model, tokenizer = load_model(model_name, dtype=dtype, device=device or "auto", trust_remote_code=trust_remote_code,
                                          model_class=AutoModelForSequenceClassification)
        if tokenizer is None:
            raise JudgeConfigError("reward-model judge: pass the tokenizer with the model")
        n_out = getattr(model.config, "num_labels", 1)
        if n_out != 1:
            raise JudgeConfigError(f"reward-model judge: expected a model with one output (a scalar reward), got num_labels={n_out}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.max_length = batch_size, max_length
        self.id = f"reward-model:{model_name or getattr(model.config, '_name_or_path', 'in-memory')}"

    def _render(self, prompt: str, response: str) -> str:
        from pofe.chat_control import neutralise_messages  # as training rendered them (pofe.models.apply_chat_template)

        msgs = neutralise_messages(self.tokenizer, [{"role": "user", "content": prompt},
                                                    {"role": "assistant", "content": response}])
        if getattr(self.tokenizer, "chat_template", None):
            from pofe.models import render_chat_template  # bounded: a template is code from the model folder

            return render_chat_template(self.tokenizer, msgs, add_generation_prompt=False)
        return f"{msgs[0]['content']}\n\n{msgs[1]['content']}"

    @torch.no_grad()
    def rewards(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        """r(x, y) for each row, in batches (right-padded; the model reads its score at the
        last non-padding token)."""
        check_batch(prompts, responses)
        device = next(self.model.parameters()).device
        out: list[float] = []
        old_side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "right"
        old_trunc = getattr(self.tokenizer, "truncation_side", "right")
        self.tokenizer.truncation_side = "left"  # keep the response when a row is too long
        try:
            for i in range(0, len(prompts), self.batch_size):
                texts = [self._render(x, y) for x, y in zip(prompts[i:i + self.batch_size], responses[i:i + self.batch_size])]
                enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False,
                                     truncation=self.max_length is not None, max_length=self.max_length).to(device)
                logits = self.model(**enc).logits  # (B, 1)
                out.extend(float(v) for v in logits[:, 0].float())
        finally:
            self.tokenizer.padding_side = old_side
            self.tokenizer.truncation_side = old_trunc
        return out

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        t0 = time.perf_counter()
        r = self.rewards(list(prompts) * 2, list(responses_a) + list(responses_b))  # one batch for A and B
        n = len(prompts)
        dt = (time.perf_counter() - t0) / max(1, n)
        out = []
        for k in range(n):
            ra, rb = r[k], r[n + k]
            if not (math.isfinite(ra) and math.isfinite(rb)):  # never invent a label
                out.append(Judgment(p=None, p_ab=None, p_ba=None, consistent=None, parse_ok=False, judge_id=self.id,
                                    latency_s=dt, extra={"reward_a": ra, "reward_b": rb}))
                continue
            p = 1.0 / (1.0 + math.exp(-max(min(ra - rb, 60.0), -60.0)))  # sigma(r_A - r_B)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id=self.id,
                                latency_s=dt, extra={"reward_a": ra, "reward_b": rb}))
        return out

    def score(self, prompts, responses, *, references=None) -> list[Score]:
        r = self.rewards(prompts, responses)
        return [Score(score=v if math.isfinite(v) else None, parse_ok=math.isfinite(v), judge_id=self.id) for v in r]
