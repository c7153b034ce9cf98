#!/usr/bin/env python
"""The device check's body (``benchmarks/device_check.sh`` installs the kit, then runs this):
one line per item on stdout, ``ITEM: PASS``, ``ITEM: FAIL <why>`` or ``ITEM: <number>``, lines
starting with ``#`` are notes; the same as JSON in ``<out>/device_check.json``.

    python benchmarks/device_check.py --kit .device-kit --out DIR [--cpu] [--only packed,losses,...]

Models are random-initialised Qwen2 with the published Qwen2-0.5B / Qwen2-1.5B shapes (layers,
hidden, MLP, heads, KV heads; tied embeddings) on the kit's tokenizer (the embedded SmolLM2's
49,152 tokens: no Qwen tokenizer can travel). ``--cpu`` runs every item with tiny shapes of the same
architecture on the CPU, so the check's code runs in CI long before a GPU is lent.

Items (``--only`` takes their first words):

* ``packed``: the packed DAP pass (each prompt once, pofe.loops.online.dap) equals the joint batch in
  log-probs and in every gradient, fp32 and bf16 autocast, SDPA and eager attention (and flash
  attention where the image has it, which pofe never packs: it must fall back to the joint batch).
* ``losses``: DPO / IPO / SLiC / the reward model's soft Bradley-Terry on the device against
  hand-computed values, and one ``dap_backward`` whose per-pair losses equal DPO computed by hand
  from separately computed log-probs.
* ``resume``: ``pofe sft`` SIGKILLed after step 3 (``POFE_FAULT``), then ``--resume``, ends with
  final weights bit-identical to an uninterrupted run's, and the same metrics rows.
* ``online``: ``pofe online`` vs TRL's ``OnlineDPOTrainer``, paired (benchmarks/device_sides.py).
* ``train``: ``pofe sft`` / ``pofe rm`` vs TRL's ``SFTTrainer`` / ``RewardTrainer``, paired.
* ``throughput``: the policy pass (packed, bf16 autocast, forward + backward) in tokens/s, its
  model FLOP/s against the device's bf16 peak measured here on one large matrix product, and the
  floor (the seconds the pass's FLOPs take at that peak).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"

# published Qwen2 configs: hidden, intermediate (MLP), layers, attention heads, KV heads
GPU_SHAPES = {"qwen2-0.5b": (896, 4864, 24, 14, 2), "qwen2-1.5b": (1536, 8960, 28, 12, 2)}
# --cpu: the same architecture, tiny (same head/KV-head grouping), so the same code runs in seconds
CPU_SHAPES = {"qwen2-0.5b": (64, 128, 2, 4, 2), "qwen2-1.5b": (96, 192, 3, 6, 2)}
# the resume check's model: small, so its checkpoints (weights + AdamW state) write in a moment
RESUME_SHAPE = {"gpu": (256, 512, 2, 4, 2), "cpu": (32, 64, 2, 2, 1)}

ITEM = re.compile(r"^[\w./+-]+$")


class Report:
    """Result lines as they happen (stdout, flushed) and all of them as JSON at the end."""

    def __init__(self, out: Path):
        self.out, self.results, self.notes = out, {}, []
        # stdout holds result lines only: libraries that print there (DeepSpeed's logger, when
        # transformers imports it) are sent to stderr, which the shell script keeps in the log
        self.stream, sys.stdout = sys.stdout, sys.stderr
        self.lock = threading.Lock()  # --cpu runs the resume item beside the paired runs

    def line(self, item: str, value, detail: str = "") -> None:
        assert ITEM.match(item), item
        if isinstance(value, float):
            value = float(f"{value:.4g}")
        with self.lock:
            self.results[item] = {"value": value, "detail": detail}
            self.stream.write(f"{item}: {value}" + (f"  # {detail}" if detail else "") + "\n")
            self.stream.flush()
            self.save()

    def passed(self, item: str, ok: bool, detail: str) -> None:
        self.line(item, "PASS" if ok else "FAIL", detail)

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)
            self.stream.write(f"# {text}\n")
            self.stream.flush()

    def save(self) -> None:
        (self.out / "device_check.json").write_text(json.dumps({"results": self.results, "notes": self.notes}, indent=1))

    def guard(self, item: str, fn, *args) -> None:
        """Run one item; an exception is its FAIL line (one line here, the traceback on stderr)."""
        t = time.perf_counter()
        try:
            fn(*args)
        except Exception as e:  # the check goes on to the next item: every item gets its line
            traceback.print_exc()
            self.line(item, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        self.note(f"{item} took {time.perf_counter() - t:.1f} s")


class Check:
    def __init__(self, args):
        import torch

        self.torch = torch
        self.cpu = args.cpu
        self.device = "cpu" if args.cpu else "cuda"
        if not args.cpu and not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --cpu for the dry run")
        self.shapes = CPU_SHAPES if args.cpu else GPU_SHAPES
        self.out = Path(args.out)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="pofe-device-check-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.report = Report(self.out)
        from transformers import AutoTokenizer

        self.tokenizer_dir = str(Path(args.kit) / "tokenizer")
        self.tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.saved: dict[str, str] = {}
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the comparisons
        torch.backends.cudnn.allow_tf32 = False
        if args.cpu:
            torch.set_num_threads(1)

    # ------------------------------------------------------------------ models
    def build(self, shape, *, seed: int = 0):
        """A random-initialised Qwen2 of ``shape`` on the device, fp32 weights."""
        from transformers import Qwen2Config, Qwen2ForCausalLM

        h, inter, layers, heads, kv = shape
        cfg = Qwen2Config(vocab_size=len(self.tok), hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                          tie_word_embeddings=True, bos_token_id=self.tok.bos_token_id,
                          eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id)
        self.torch.manual_seed(seed)
        with self.torch.device(self.device):
            model = Qwen2ForCausalLM(cfg)
        return model.float()

    def saved_model(self, name: str, shape) -> str:
        """The model folder (bf16 weights, the kit's tokenizer) the subprocess items load."""
        if name not in self.saved:
            path = self.work / "models" / name
            model = self.build(shape)
            model.to(self.torch.bfloat16).save_pretrained(str(path))
            self.tok.save_pretrained(str(path))
            del model
            self.saved[name] = str(path)
        return self.saved[name]

    def pairs(self, n: int, prompt: tuple[int, int], response: tuple[int, int], seed: int = 0):
        from pofe.loops.online.dap import TokenPair

        rng = random.Random(seed)
        ids = lambda k: tuple(rng.randrange(100, len(self.tok) - 100) for _ in range(k))  # noqa: E731
        return [TokenPair(ids(rng.randint(*prompt)), ids(rng.randint(*response)) + (self.tok.eos_token_id,),
                          ids(rng.randint(*response)) + (self.tok.eos_token_id,), p=[1.0, 0.8, 0.6][i % 3],
                          pair_id=str(i)) for i in range(n)]

    # ------------------------------------------------------------------ items
    def packed(self) -> None:
        """Packed pass == joint batch (pofe.loops.online.dap; tests/loops/test_online_invariants.py on CPU)."""
        pairs = self.pairs(4, (6, 12), (3, 8)) if self.cpu else self.pairs(4, (30, 46), (20, 48))
        pad = self.tok.pad_token_id
        for name, shape in self.shapes.items():
            model = self.build(shape)
            model.train()
            for precision in ("fp32", "bf16"):
                for attention in ("sdpa", "eager"):
                    item = f"packed_vs_joint/{name}/{precision}/{attention}"
                    self.report.guard(item, self._packed_one, model, pairs, pad, precision, attention, item)
            if _has_flash():
                item = f"packed_vs_joint/{name}/bf16/flash_attention_2_falls_back"
                self.report.guard(item, self._flash_one, model, pairs, pad, item)
            del model
            if not self.cpu:
                self.torch.cuda.empty_cache()
        if not _has_flash():
            self.report.note("flash_attn is not installed in this image: no flash-attention line "
                             "(pofe packs only under SDPA and eager attention)")

    def _packed_one(self, model, pairs, pad, precision, attention, item) -> None:
        from pofe.loops.online import dap
        from pofe.runtime.precision import autocast

        torch = self.torch
        model.set_attn_implementation(attention)
        dap._PACKING.pop(model, None)  # the once-per-model agreement check runs for every variant
        lps, packed_grads, diff2, norm2, finite = [], [], 0.0, 0.0, True
        for packed in (True, False):
            model.zero_grad(set_to_none=True)
            with autocast(precision, self.device):
                lp = dap.packed_pair_logps(model, pairs, pad, self.device) if packed else \
                    dap.completion_logps(model, *dap.pairs_batch(pairs, pad, self.device))
            if lp is None:
                self.report.line(item, "FAIL", "the packed pass refused this model (its log-probs disagreed with the "
                                 "joint batch's in the once-per-model check): it would train on the joint batch")
                return
            (lp * torch.linspace(-1, 1, len(lp), device=lp.device)).sum().backward()  # distinct weight per response
            lps.append(lp.detach().double())
            if packed:  # one fp32 copy of the gradients (Qwen2-1.5B: 6 GB), compared tensor by tensor below
                packed_grads = [p.grad.clone() for p in model.parameters()]
                finite = all(bool(torch.isfinite(g).all()) for g in packed_grads)
        for gp, p in zip(packed_grads, model.parameters()):
            diff2 += float((gp.double() - p.grad.double()).pow(2).sum())
            norm2 += float(p.grad.double().pow(2).sum())
        del packed_grads
        lp_p, lp_j = lps
        lp_rel = float((lp_p - lp_j).abs().max() / lp_j.abs().max())
        g_rel = math.sqrt(diff2 / norm2)
        # fp32: float rounding of two summation orders; bf16: each pass rounds its activations to bf16
        # in a different order (the CPU test's tolerances, rtol 0.02 on log-probs)
        lp_tol, g_tol = (1e-5, 1e-4) if precision == "fp32" else (2e-2, 5e-2)
        self.report.passed(item, lp_rel <= lp_tol and g_rel <= g_tol and finite,
                           f"log-prob max rel diff {lp_rel:.2e} (<= {lp_tol:g}), gradient rel norm diff {g_rel:.2e} "
                           f"(<= {g_tol:g}), {len(pairs)} pairs, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")
        model.zero_grad(set_to_none=True)

    def _flash_one(self, model, pairs, pad, item) -> None:
        from pofe.loops.online import dap
        from pofe.runtime.precision import autocast

        model.set_attn_implementation("flash_attention_2")
        with self.torch.no_grad(), autocast("bf16", self.device):
            refused = dap.packed_pair_logps(model, pairs, pad, self.device) is None
            lp = dap.pair_logps(model, pairs, pad, self.device)
            model.set_attn_implementation("sdpa")
            joint = dap.completion_logps(model, *dap.pairs_batch(pairs, pad, self.device))
        rel = float((lp.double() - joint.double()).abs().max() / joint.double().abs().max())
        self.report.passed(item, refused and rel <= 2e-2, f"packing refused: {refused}; flash joint vs SDPA joint "
                                                          f"log-prob max rel diff {rel:.2e}")

    def losses(self) -> None:
        self.report.guard("losses/hand_values", self._hand_values)
        self.report.guard("losses/dap_backward_vs_hand_dpo", self._dap_vs_hand)

    def _hand_values(self) -> None:
        from pofe.losses import dpo, ipo, slic, soft_bt_loss

        torch = self.torch
        # tests/core/test_losses.py's pair: h = (-1 - -1.5) - (-2 - -1.5) = 1
        pc, pr, rc, rr = (torch.tensor([x], device=self.device) for x in (-1.0, -2.0, -1.5, -1.5))
        z = 0.1  # beta * h
        want = {
            "dpo beta 0.1": (dpo(pc, pr, rc, rr, beta=0.1), math.log1p(math.exp(-0.1))),  # -log sigma(0.1) = 0.644397
            "dpo soft p 0.7": (dpo(pc, pr, rc, rr, beta=0.1, p=0.7),
                               -(0.7 * math.log(1 / (1 + math.exp(-z))) + 0.3 * math.log(1 / (1 + math.exp(z))))),
            "ipo beta 1": (ipo(pc, pr, rc, rr, beta=1.0), 0.25),  # (1 - 1/2)^2
            "ipo soft p 0.75": (ipo(pc, pr, rc, rr, beta=1.0, p=0.75), 0.5625),  # target 0.25: (1 - 0.25)^2
            "slic beta 0.002": (slic(pc, pr, rc, rr, beta=0.002), 0.998),  # 1 - 0.002
            "slic soft p 0.75": (slic(pc, pr, rc, rr, beta=0.002, p=0.75), 0.999),  # 0.75 * 0.998 + 0.25 * 1.002
        }
        got = {k: float(v.losses.item()) for k, (v, _) in want.items()}
        got["soft-bt margin 0 p 0.7"] = float(soft_bt_loss(torch.zeros(1, device=self.device), 0.7).item())
        hand = {**{k: w for k, (_, w) in want.items()}, "soft-bt margin 0 p 0.7": math.log(2)}  # BCE at logit 0
        worst = max(abs(got[k] - hand[k]) for k in hand)
        self.report.passed("losses/hand_values", worst <= 1e-6, f"{len(hand)} values on {self.device}, "
                                                                  f"max |diff| {worst:.1e}")

    def _dap_vs_hand(self) -> None:
        """dap_backward's per-pair DPO losses equal -log sigma(beta h) computed here by hand from the
        policy's and the reference's summed log-probs (each from its own joint-batch pass)."""
        from pofe.losses import dpo
        from pofe.runtime import Reference
        from pofe.loops.online.dap import completion_logps, dap_backward, pairs_batch

        torch = self.torch
        shape = RESUME_SHAPE["cpu" if self.cpu else "gpu"]
        policy = self.build(shape)
        ref = Reference(policy, lora=False)
        with torch.no_grad():
            g = torch.Generator(device=self.device).manual_seed(1)
            for p in policy.parameters():  # a policy away from its reference: margins are not 0
                p.add_(0.02 * torch.randn(p.shape, generator=g, device=self.device))
        pairs, pad, beta = self.pairs(4, (5, 9), (3, 6), seed=1), self.tok.pad_token_id, 0.1
        res = dap_backward(policy, ref, pairs, loss_fn=dpo, beta=beta, micro_batches=2, normaliser=len(pairs),
                           pad_token_id=pad, device=self.device)
        with torch.no_grad(), ref.model() as r:
            pol = completion_logps(policy, *pairs_batch(pairs, pad, self.device)).double().tolist()
            rf = completion_logps(r, *pairs_batch(pairs, pad, self.device)).double().tolist()
        m = len(pairs)
        worst, margins = 0.0, []
        for j, ps in enumerate(res.pairs):
            h = (pol[j] - rf[j]) - (pol[m + j] - rf[m + j])
            pj = pairs[j].p
            hand = -(pj * math.log(1 / (1 + math.exp(-beta * h))) + (1 - pj) * math.log(1 / (1 + math.exp(beta * h))))
            worst = max(worst, abs(ps.loss - hand) / max(1.0, abs(hand)))
            margins.append(abs(beta * h))
        grad = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in policy.parameters() if p.grad is not None))
        self.report.passed("losses/dap_backward_vs_hand_dpo", worst <= 1e-4 and grad > 0 and max(margins) > 1e-4,
                           f"{m} pairs, max rel diff {worst:.1e}, |beta h| up to {max(margins):.3g}, "
                           f"gradient norm {grad:.3g}")

    def resume(self) -> None:
        """SIGKILL after step 3 of 4 (checkpoint every 2), ``--resume``: bit-identical final weights."""
        from safetensors.torch import load_file

        import yaml

        model = self.saved_model("resume", RESUME_SHAPE["cpu" if self.cpu else "gpu"])
        runs = self.work / "runs"
        runs.mkdir(exist_ok=True)
        ift = self.work / "ift.jsonl"
        ift.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": f"Answer number {i}" +
                                           " and more" * (i % 3) + "."}) + "\n" for i in range(8)))

        def config(name: str) -> Path:
            cfg = {"model": {"name": model, "device": self.device}, "data": {"ift": [str(ift)]},
                   "train": {"steps": 4, "batch_size": 2, "grad_accum": 1},
                   "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.2},
                   "checkpoint": {"every": 2}, "log": {"progress": False, "tensorboard": False},
                   "run": {"output_dir": str(runs), "name": name}}
            path = runs / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            return path

        def pofe(*argv: str, fault: str | None = None):
            env = {**os.environ, **({"POFE_FAULT": fault} if fault else {})}
            if self.cpu:  # one thread: the two runs do the same arithmetic in the same order
                env["OMP_NUM_THREADS"] = "1"
            return subprocess.run([sys.executable, "-m", "pofe", *argv], env=env, capture_output=True, text=True,
                                  timeout=300)

        # On CUDA a second uninterrupted run tells a resume bug from kernels that are not deterministic
        # run to run (SDPA's memory-efficient backward accumulates with atomics unless told otherwise).
        names = ["full", "crash"] + ([] if self.cpu else ["full-again"])
        with ThreadPoolExecutor(len(names)) as pool:
            futures = {n: pool.submit(pofe, "sft", "--config", str(config(n)), fault="3:after_step" if n == "crash" else None)
                       for n in names}
            done = {n: f.result() for n, f in futures.items()}
        full, crash = done["full"], done["crash"]
        if full.returncode != 0 or crash.returncode != -9 or any(done[n].returncode != 0 for n in names[2:]):
            sys.stderr.write(full.stderr[-3000:] + crash.stderr[-3000:])
            self.report.line("resume/sft_sigkill_bit_identical", "FAIL",
                             f"uninterrupted rc {full.returncode}, killed rc {crash.returncode} (want 0, -9)")
            return
        resumed = pofe("sft", "--resume", str(runs / "crash"))
        if resumed.returncode != 0:
            sys.stderr.write(resumed.stderr[-3000:])
            self.report.line("resume/sft_sigkill_bit_identical", "FAIL", f"--resume rc {resumed.returncode}")
            return
        a = load_file(str(runs / "crash" / "final" / "model.safetensors"))
        b = load_file(str(runs / "full" / "final" / "model.safetensors"))
        base = load_file(str(Path(model) / "model.safetensors"))
        same = a.keys() == b.keys() and all(self.torch.equal(a[k], b[k]) for k in a)
        diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a) if a.keys() == b.keys() else math.inf
        moved = max(float((b[k].float() - base[k].float()).abs().max()) for k in b if k in base)
        again = ""
        if "full-again" in names:
            c = load_file(str(runs / "full-again" / "final" / "model.safetensors"))
            again = f"; two uninterrupted runs bit-identical: {all(self.torch.equal(b[k], c[k]) for k in b)}"
        timing = ("seconds", "wall_time", "cpu_time", "tokens_per_s")

        def rows(run: str):
            return [{k: v for k, v in json.loads(x).items() if k not in timing and not k.startswith("time_")}
                    for x in (runs / run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        same_rows = rows("crash") == rows("full")
        self.report.passed("resume/sft_sigkill_bit_identical", same and same_rows and moved > 0,
                           f"final weights identical: {same} (max |diff| {diff:.1e}), metrics rows equal: {same_rows}, "
                           f"weights moved {moved:.2e} from the initial model{again}")

    def online(self) -> None:
        model = self.saved_model("qwen2-0.5b", self.shapes["qwen2-0.5b"])
        prompts = self.work / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"Write one sentence about topic number {i}."}) + "\n"
                                   for i in range(32)))
        steps = 2 if self.cpu else 5  # the first step is not timed
        common = ["--model", model, "--device", self.device, "--bf16", "--steps", str(steps), "--prompts", str(prompts),
                  "--max-new-tokens", "8" if self.cpu else "48", "--work", str(self.work / "online")]
        self._paired("online", [sys.executable, str(HERE / "device_sides.py"), "pofe-online", *common],
                     [sys.executable, str(HERE / "device_sides.py"), "trl-online", *common])

    def train(self) -> None:
        model = self.saved_model("qwen2-0.5b", self.shapes["qwen2-0.5b"])
        rng = random.Random(0)
        words = "the a model answer question data step weight token batch good short long river stone light".split()
        say = lambda n: " ".join(rng.choice(words) for _ in range(n)) + "."  # noqa: E731
        n_words = 12 if self.cpu else 90  # rows well under max_length: no side truncates or drops
        steps, batch, max_length = (2, 2, 128) if self.cpu else (6, 8, 512)  # the first step is not timed
        for command in ("sft", "rm"):
            rows = self.work / f"{command}-rows.jsonl"
            if command == "sft":
                data = [{"prompt": say(n_words // 3), "completion": say(n_words)} for _ in range(steps * batch)]
            else:
                data = [{"prompt": say(n_words // 3), "chosen": say(n_words), "rejected": say(n_words // 2)}
                        for _ in range(steps * batch)]
            rows.write_text("".join(json.dumps(r) + "\n" for r in data))
            flags = ["--model", model, "--device", self.device, "--steps", str(steps), "--batch", str(batch),
                     "--max-length", str(max_length), "--bf16", "--data", str(rows),
                     "--work", str(self.work / f"train-{command}")]
            self.report.guard(f"vs_trl/{command}", self._paired, command,
                              [sys.executable, str(HERE / "device_sides.py"), "pofe-train", "--command", command, *flags],
                              [sys.executable, str(HERE / "trl_train_side.py"), "--command", command, *flags])

    def _paired(self, name: str, pofe_cmd: list[str], trl_cmd: list[str]) -> None:
        """pofe then TRL, each in its own process: s/step, peak memory (GPU, else the process's RSS), ratio."""
        res = {}
        for side, cmd in (("pofe", pofe_cmd), ("trl", trl_cmd)):
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                               env={**os.environ, **({"OMP_NUM_THREADS": "1"} if self.cpu else {})})
            if p.returncode != 0:
                sys.stderr.write(p.stderr[-4000:])
                self.report.line(f"vs_trl/{name}/{side}_s_per_step", "FAIL", f"rc {p.returncode}: "
                                 f"{(p.stderr.strip().splitlines() or [''])[-1][:200]}")
                return
            res[side] = json.loads(p.stdout.strip().splitlines()[-1])
        for side in ("pofe", "trl"):
            self.report.line(f"vs_trl/{name}/{side}_s_per_step", float(res[side]["seconds_per_step"]),
                             f"median of steps 2..{res[side]['steps']}")
            peak = res[side].get("peak_gpu_gib")
            if peak is not None:
                self.report.line(f"vs_trl/{name}/{side}_peak_gpu_gib", float(peak))
            elif "peak_rss_gb" in res[side]:
                self.report.line(f"vs_trl/{name}/{side}_peak_rss_gb", float(res[side]["peak_rss_gb"]))
        self.report.line(f"vs_trl/{name}/speedup", res["trl"]["seconds_per_step"] / res["pofe"]["seconds_per_step"],
                         "TRL s/step over pofe s/step (one paired round)")

    def throughput(self) -> None:
        peak = self._peak_bf16()
        self.report.line("throughput/peak_bf16_tflops", peak / 1e12, "one large bf16 matrix product, measured here")
        for name, shape in self.shapes.items():
            self.report.guard(f"throughput/{name}", self._throughput_one, name, shape, peak)

    def _peak_bf16(self) -> float:
        torch = self.torch
        n = 1024 if self.cpu else 8192
        a = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        reps = 2 if self.cpu else 10
        for _ in range(2):
            a @ b
        self._sync()
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        self._sync()
        return 2 * n ** 3 * reps / (time.perf_counter() - t)

    def _sync(self) -> None:
        if not self.cpu:
            self.torch.cuda.synchronize()

    def _throughput_one(self, name: str, shape, peak: float) -> None:
        from pofe.loops.online.dap import pair_logps
        from pofe.runtime.precision import autocast

        model = self.build(shape)
        model.train()
        model.set_attn_implementation("sdpa")
        n, prompt, resp = (4, 16, 16) if self.cpu else (8, 256, 256)
        pairs = self.pairs(n, (prompt, prompt), (resp - 1, resp - 1), seed=2)

        def once() -> float:
            self._sync()
            t = time.perf_counter()
            with autocast("bf16", self.device):
                lp = pair_logps(model, pairs, self.tok.pad_token_id, self.device)
            lp.sum().backward()
            self._sync()
            model.zero_grad(set_to_none=True)
            return time.perf_counter() - t

        for _ in range(2):
            once()
        secs = statistics.median(once() for _ in range(3 if self.cpu else 5))
        h, inter, layers, heads, kv = shape
        V = len(self.tok)
        row = prompt + 2 * (resp - 1)  # packed row: prompt, chosen[:-1], rejected[:-1]
        kept = 1 + 2 * (resp - 1)  # positions whose logits are computed (logits_to_keep)
        head_dim = h // heads
        per_token = 2 * (h * h + 2 * h * kv * head_dim + h * h) + 2 * 3 * h * inter  # q, k, v, o and the MLP, x2 FLOP
        fwd = n * (layers * (row * per_token + 4 * row * row * h) + kept * 2 * h * V)  # the mask is dense: full L x L
        flops = 3 * fwd  # backward = 2 x forward
        tokens = sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in pairs)
        self.report.line(f"throughput/{name}/policy_pass_s", secs, f"{n} pairs of {prompt} + 2 x {resp} tokens, "
                                                                     "packed, bf16 autocast, forward + backward")
        self.report.line(f"throughput/{name}/tokens_per_s", tokens / secs, "each response with its prompt, as pofe counts")
        self.report.line(f"throughput/{name}/model_tflops", flops / secs / 1e12, "achieved model FLOP/s")
        self.report.line(f"throughput/{name}/floor_s", flops / peak, "the pass's FLOPs at the measured bf16 peak")
        self.report.line(f"throughput/{name}/fraction_of_peak", flops / secs / peak)


def _has_flash() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


ITEMS = ("packed", "losses", "resume", "online", "train", "throughput")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (the CI dry run)")
    ap.add_argument("--kit", default=str(REPO / ".device-kit"))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/pofe-device-check"))
    ap.add_argument("--work", help="models and runs (default: a new temporary folder; never $OUT, whose files travel back)")
    ap.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated, of {', '.join(ITEMS)}")
    args = ap.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if set(only) - set(ITEMS):
        ap.error(f"--only: unknown {sorted(set(only) - set(ITEMS))}; items: {', '.join(ITEMS)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    check = Check(args)
    torch = check.torch
    import transformers

    dev = "cpu (dry run)" if args.cpu else torch.cuda.get_device_name(0)
    check.report.note(f"device {dev}; python {sys.version.split()[0]}, torch {torch.__version__}, "
                      f"transformers {transformers.__version__}; work {check.work}")
    # --cpu: the resume item's processes run beside the paired runs' (the dry run's numbers are not
    # timings, and the two CPUs of a CI machine are then both busy); on the GPU, one item at a time
    beside = [x for x in only if args.cpu and x == "resume"]
    if beside:  # the models first: building them seeds torch's one global generator
        check.saved_model("resume", RESUME_SHAPE["cpu"])
        check.saved_model("qwen2-0.5b", check.shapes["qwen2-0.5b"])
    with ThreadPoolExecutor(1) as pool:
        running = [pool.submit(check.report.guard, item, getattr(check, item)) for item in beside]
        for item in only:
            if item not in beside:
                check.report.guard(item, getattr(check, item))
        for f in running:
            f.result()
    check.report.line("total_s", time.perf_counter() - t0)
    return 1 if any(r["value"] == "FAIL" for r in check.report.results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
