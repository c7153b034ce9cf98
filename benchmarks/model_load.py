"""Time loading the embedded default model: the one-off GGUF conversion (fresh $POFE_HOME)
and a cached load, plus one chat answer. Prints JSON.

    .venv/bin/python benchmarks/model_load.py
    .venv/bin/python benchmarks/model_load.py --smoke   # a tiny random model folder (no conversion): runs in seconds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
from pofe.models import load_model
from pofe.generation import generate, SamplingConfig
name, new = sys.argv[1], int(sys.argv[2])
t = time.perf_counter(); m, tok = load_model(name); first = time.perf_counter() - t
t = time.perf_counter(); m, tok = load_model(name); second = time.perf_counter() - t
out = generate(m, tok, ["Name three primary colours."], sampling=SamplingConfig(max_new_tokens=new, temperature=0.0))
print(json.dumps({"first_load_s": round(first, 2), "cached_load_s": round(second, 2), "answer": out[0][0].text}))
"""


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny random model folder, 4 new tokens")
    args = ap.parse_args()
    model, new = "smollm2-135m-instruct", "32"
    if args.smoke:
        from machine import smoke_model

        model, new = smoke_model(), "4"
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, POFE_HOME=home)
        child = [sys.executable, "-c", CHILD, model, new]
        r = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
        fresh = json.loads(r.stdout.strip().splitlines()[-1])
        # a new process with a warm cache (what every later command sees)
        r = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
        warm = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps({"conversion_first_load_s": fresh["first_load_s"], "cached_load_same_process_s": fresh["cached_load_s"],
                      "cached_load_new_process_s": warm["first_load_s"], "answer": warm["answer"]}, indent=2))


if __name__ == "__main__":
    main()
