"""``pofe chat``: answer prompts with a model (a smoke test of the embedded default)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, resolve_config
from pofe.config import PofeConfig
from pofe.generation import SamplingConfig
from pofe.training import LoadConfig


class ChatConfig(PofeConfig):
    model: LoadConfig = LoadConfig()
    """The model (``model.name``: embedded name, Hugging Face id or local directory; ``model.device``)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.0)
    seed: int = 0


def register(app: typer.Typer) -> None:
    @app.command(help="Answer prompts with a model (smoke test of a model and its chat template).")
    def chat(
        prompt: list[str] = typer.Argument(..., help="One or more prompts."),
        model: Optional[str] = typer.Option(None, help="Model name, id or path (default: embedded SmolLM2)."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(ChatConfig, config, set_, {"model.name": model}, print_config)
        from pofe.generation import generate
        from pofe.models import load_model

        t0 = time.perf_counter()
        m, tok = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device,
                            trust_remote_code=cfg.model.trust_remote_code)
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        outs = generate(m, tok, prompt, n=1, sampling=cfg.sampling, seed=cfg.seed)
        gen_s = time.perf_counter() - t1
        rows = [{"prompt": p, "response": g[0].text, "tokens": g[0].num_tokens} for p, g in zip(prompt, outs)]
        if json_out:
            emit_json({"model": cfg.model.name, "load_seconds": round(load_s, 3), "generate_seconds": round(gen_s, 3), "responses": rows})
        else:
            typer.echo(f"loaded {cfg.model.name} in {load_s:.2f} s; generated in {gen_s:.2f} s")
            for r in rows:
                typer.echo(f"\n> {r['prompt']}\n{r['response']}")
