#!/usr/bin/env python
"""The anchor's TRL Online DPO run (``../shared/anchors/trl/trl_bench.py``, one loss type) at
another batch shape, for ``benchmarks/curves.py``: ``--batch`` prompts per step and
``--max-new-tokens`` instead of trl_bench's fixed 4 and 48. Run with the anchor's Python; takes
trl_bench's own arguments too and prints the result lines that ``benchmarks/vs_trl.py``'s
``run_trl`` reads.

trl_bench.py is the shared anchor (read-only here), so its child is run in this process with
``OnlineDPOConfig`` wrapped to change the two fields; everything else is trl_bench's. TRL's
Online DPO samples two completions per prompt, always: there is no samples-per-prompt axis.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

ANCHOR = Path(__file__).resolve().parent.parent.parent / "shared" / "anchors" / "trl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4, help="prompts per step (per_device_train_batch_size)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--loss-types", default="sigmoid")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--judge", choices=["llm", "length"], default="llm")
    ap.add_argument("--both-orders", action="store_true")
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    loss = a.loss_types.split(",")[0]
    spec = importlib.util.spec_from_file_location("trl_bench", ANCHOR / "trl_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # sets the offline environment variables, as a trl_bench run does

    import trl.experimental.online_dpo as od

    orig = od.OnlineDPOConfig

    def shaped(**kw):
        kw.update(per_device_train_batch_size=a.batch, max_new_tokens=a.max_new_tokens,
                  output_dir=os.path.join(bench.ANCHOR_DIR, f"out_{loss}-shape"))
        return orig(**kw)

    od.OnlineDPOConfig = shaped
    child = argparse.Namespace(child=loss, steps=a.steps, judge=a.judge, both_orders=a.both_orders, grad_ckpt=a.grad_ckpt,
                               threads=a.threads, bf16=a.bf16, seed=a.seed, tag="-shape")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench.run_child(child)
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("RESULT_JSON="))
    r = json.loads(line[len("RESULT_JSON="):])
    r.update(batch=a.batch, max_new_tokens=a.max_new_tokens)
    print(f"RESULT {loss}: " + json.dumps(r))
    print(f"TRL_ONLINE_DPO_S_PER_STEP_{loss.upper()}={r['median_s_per_step_excl_first']}")
    print(f"TRL_ONLINE_DPO_PEAK_RSS_MB_{loss.upper()}={r['peak_rss_mb']}")
    print(f"TRL_ONLINE_DPO_S_PER_STEP={r['median_s_per_step_excl_first']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
