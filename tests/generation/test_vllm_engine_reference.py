"""``reference.source: engine`` on a real in-process vLLM engine (tiny model, fp32): the engine's
summed response log-probs equal the trainer's pi_0 pass; an online run measures the gap on step 1,
switches, frees the frozen copy and trains to the same losses as the trainer's own reference pass;
a run killed after the switch resumes with the engine and ends on the same weights."""

from __future__ import annotations

import pytest
import torch

from tests.generation.conftest import PROMPTS

pytestmark = pytest.mark.usefixtures("vllm_ok")

VLLM = ["sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=768"]


def _judge(model_dir):
    # a longer context than the sampler's: an engine of its own (identical settings share one, which
    # swaps pi_0 and the policy every step: the shared-engine test below)
    return ["judge.kind=vllm", f"judge.model={model_dir}", "judge.vllm.dtype=float32", "judge.vllm.max_model_len=1024",
            "judge.cache.enabled=false"]


@pytest.mark.slow
def test_engine_completion_logprobs_equal_the_trainer_pass(tiny64_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig
    from pofe.generation.vllm import generator_for
    from pofe.loops.online.dap import TokenPair, pair_logps

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32).eval()
    gen = generator_for(model, tokenizer, SamplingConfig(engine="vllm", vllm={"dtype": "float32", "max_model_len": 1024}))
    ids = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS[:2]]
    pairs = [TokenPair(ids[0], (11, 12, 13), (14,), 1.0, "a"), TokenPair(ids[1], (15, 16), (17, 18, 19, 20), 1.0, "b")]
    seqs = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
    eng = torch.tensor(gen.completion_logprobs(seqs))
    with torch.no_grad():
        hf = pair_logps(model, pairs, tokenizer.pad_token_id, "cpu", shared=False)
    assert eng.shape == (4,) and torch.allclose(eng, hf, atol=1e-4), (eng, hf)
    assert float(eng.max()) < -1.0  # real log-probs of random tokens, not zeros


@pytest.mark.slow
def test_a_frozen_generator_pushes_its_file_after_another_model_synced_the_shared_engine(tiny64_dir, tokenizer):
    """freeze(): pi_0's generator lets its model go and, on an engine the policy's generator also
    syncs, pushes pi_0 from its file whenever it reads; no push when the engine already holds it."""
    import copy

    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig
    from pofe.generation.vllm import generator_for
    from pofe.loops.online.dap import TokenPair, pair_logps

    pi0 = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32).eval()
    policy = copy.deepcopy(pi0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sampling = SamplingConfig(engine="vllm", vllm={"dtype": "float32", "max_model_len": 768})
    g0, gp = generator_for(pi0, tokenizer, sampling), generator_for(policy, tokenizer, sampling)
    assert g0.engine is gp.engine  # one pooled engine, as the online bar's sampler and pi_0 annotator
    ids = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS[:2]]
    pairs = [TokenPair(ids[0], (11, 12, 13), (14,), 1.0, "a"), TokenPair(ids[1], (15, 16), (17, 18, 19, 20), 1.0, "b")]
    seqs = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
    with torch.no_grad():
        want0, wantp = (pair_logps(m, pairs, tokenizer.pad_token_id, "cpu", shared=False) for m in (pi0, policy))
    assert float((want0 - wantp).abs().max()) > 0.1  # the two models read apart

    first = torch.tensor(g0.completion_logprobs(seqs))
    syncs = g0.syncs
    g0.freeze()
    assert g0.model is None and g0.weights_file is not None
    assert torch.allclose(torch.tensor(g0.completion_logprobs(seqs)), first, atol=1e-5) and g0.syncs == syncs  # held
    assert torch.allclose(torch.tensor(gp.completion_logprobs(seqs)), wantp, atol=1e-4)  # the policy pushed
    again = torch.tensor(g0.completion_logprobs(seqs))  # pi_0 pushed back, from the file
    assert g0.syncs == syncs + 1 and torch.allclose(again, want0, atol=1e-4), (again, want0)
    assert torch.allclose(torch.tensor(gp.completion_logprobs(seqs)), wantp, atol=1e-4)


def _start_engine(model_dir, sampling):
    """Start the pooled engine outside the generators: vLLM logs an exception while starting, and the
    traceback it keeps would hold the frames (and so the generator) that started it."""
    from pofe.generation.vllm import shared_engine

    shared_engine(str(model_dir), sampling.vllm)


def _shared_pi0_and_policy(tiny64_dir, tokenizer, **vllm):
    import copy

    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig
    from pofe.generation.vllm import generator_for
    from pofe.loops.online.dap import TokenPair

    pi0 = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32).eval()
    policy = copy.deepcopy(pi0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # settings of their own (batch limits): an engine no earlier test has kept weights in
    sampling = SamplingConfig(engine="vllm", vllm={"dtype": "float32", "max_model_len": 768, "max_num_seqs": 8, **vllm})
    _start_engine(tiny64_dir, sampling)
    g0, gp = generator_for(pi0, tokenizer, sampling), generator_for(policy, tokenizer, sampling)
    assert g0.engine is gp.engine
    ids = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS[:2]]
    pairs = [TokenPair(ids[0], (11, 12, 13), (14,), 1.0, "a"), TokenPair(ids[1], (15, 16), (17, 18, 19, 20), 1.0, "b")]
    seqs = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
    return g0, gp, seqs


@pytest.mark.slow
def test_frozen_weights_are_kept_in_the_shared_engine_and_swapped_back_exactly(tiny64_dir, tokenizer, monkeypatch):
    """After freeze(), the policy's push keeps pi_0's weights in the engine; pi_0's next read swaps them
    back (no file read, no reload) and gives the very bits pi_0 gave before; the policy's next push is an
    ordinary reload and reads what it read before."""
    import pofe.generation.vllm as V

    g0, gp, seqs = _shared_pi0_and_policy(tiny64_dir, tokenizer)
    eng = g0.engine
    swaps = eng.swaps  # the pooled engine may have served an earlier test
    first = g0.completion_logprobs(seqs)
    g0.freeze()
    pol = gp.completion_logprobs(seqs)
    assert eng.kept is not None and eng.kept.fp == g0._synced and eng.swaps == swaps
    reloads, reads, real_read = [], [], V.read_safetensors

    def read(path, names=None):
        assert names is not None, "pi_0's whole file was read"
        reads.append(real_read(path, names))
        return reads[-1]

    monkeypatch.setattr(V, "read_safetensors", read)
    real_load = eng.load_full
    monkeypatch.setattr(eng, "load_full", lambda w, fp: (reloads.append(fp), real_load(w, fp)))
    syncs = g0.syncs
    for _ in range(2):  # pi_0, policy, pi_0, policy: swaps for pi_0, reloads for the policy
        assert g0.completion_logprobs(seqs) == first
        assert gp.completion_logprobs(seqs) == pol
    assert eng.swaps == swaps + 2 and g0.syncs == syncs + 2 and eng.kept.verified
    assert reloads == [gp._synced, gp._synced]
    # each swap read back only the tensors vLLM keeps unpacked (embedding, norms), not the linears
    assert len(reads) == 2 and {n for n, _ in reads[0]} == {n for n, _ in reads[1]}
    assert "model.embed_tokens.weight" in {n for n, _ in reads[0]}
    assert not [n for n, _ in reads[0] if "proj" in n]
    # what runs when pi_0's generator is collected (a test cannot count on collection: pytest's log
    # capture keeps tracebacks whose frames hold it)
    assert [f.alive for f in g0._forgets] == [True]
    g0._forgets[0]()
    assert eng.kept is None and not eng.frozen  # pi_0's generator gone: nothing kept for it


@pytest.mark.slow
def test_a_swap_that_does_not_reproduce_the_kept_weights_falls_back_to_reloading(tiny64_dir, tokenizer, monkeypatch,
                                                                                 caplog):
    """The first swap is checked against pi_0's probe log-probs: a swap that leaves other weights in
    place (here: one that installs nothing) is caught, the kept copy dropped, and pi_0 reloaded from its
    file, so the read is still pi_0's."""
    import pofe.generation.kept_weights as K

    g0, gp, seqs = _shared_pi0_and_policy(tiny64_dir, tokenizer)
    eng = g0.engine
    eng.can_keep, swaps = True, eng.swaps  # the pooled engine may have served an earlier test
    first = g0.completion_logprobs(seqs)
    g0.freeze()
    gp.completion_logprobs(seqs)
    assert eng.kept is not None
    monkeypatch.setattr(K, "install", lambda model, state, read=None: None)
    with caplog.at_level("WARNING", logger="pofe.generation.vllm"):
        got = g0.completion_logprobs(seqs)
    assert "swapping kept weights back failed" in caplog.text and "probe" in caplog.text
    assert eng.kept is None and not eng.can_keep and eng.swaps == swaps
    assert torch.allclose(torch.tensor(got), torch.tensor(first), atol=1e-5)


def _args(tmp_path, model_dir, name, *more):
    sets = [f"model.name={model_dir}", "train.steps=4", "train.batch_size=2", "sampling.max_new_tokens=5",
            "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint.every=2", "eval.enabled=false", "log.progress=false",
            "log.tensorboard=false", *VLLM, *_judge(model_dir), f"run.output_dir={tmp_path}", f"run.name={name}", *more]
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def own_engines(tmp_path_factory, tiny64_dir):
    """The run both tests below compare with: the trainer's own reference pass, the sampler and the
    judge on two engines of their own (run once for the module)."""
    from tests._cli import pofe

    work = tmp_path_factory.mktemp("own-engines")
    res = pofe("online", *_args(work, tiny64_dir, "own"))
    assert res.returncode == 0, res.stderr[-2000:]
    return res, work / "own"


@pytest.mark.slow
def test_online_switches_to_the_engine_reference_and_resumes_with_it(tmp_path, tiny64_dir, own_engines):
    from safetensors.torch import load_file

    from pofe.runs import read_jsonl
    from tests._cli import pofe

    _, model = own_engines
    engine = pofe("online", *_args(tmp_path, tiny64_dir, "engine", "reference.source=engine"))
    assert engine.returncode == 0, engine.stderr[-2000:]
    rm, re_ = (read_jsonl(d / "metrics.jsonl") for d in (model, tmp_path / "engine"))
    assert re_[0]["reference/from_engine"] == 1.0 and re_[0]["reference/engine_gap"] < 1e-4  # fp32 both sides
    assert all("reference/engine_gap" not in r for r in re_[1:] + rm)  # measured once
    # from step 1 on (the switch comes before step 1's update) the engine's numbers, equal to float rounding
    assert [r["loss"] for r in re_] == pytest.approx([r["loss"] for r in rm], abs=1e-4)
    import json

    s = json.loads((tmp_path / "engine" / "summary.json").read_text())
    assert s["reference"]["source"] == "engine" and s["reference"]["max_gap"] == 0.02

    crashed = pofe("online", *_args(tmp_path, tiny64_dir, "crash", "reference.source=engine"), POFE_FAULT="3:after_judge")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    resumed = pofe("online", "--resume", str(tmp_path / "crash"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = (load_file(str(tmp_path / n / "final" / "model.safetensors")) for n in ("engine", "crash"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rc = read_jsonl(tmp_path / "crash" / "metrics.jsonl")
    assert [r["loss"] for r in rc] == [r["loss"] for r in re_]


@pytest.mark.slow
def test_annotator_with_the_samplers_settings_shares_its_engine_and_trains_alike(tmp_path, tiny64_dir, own_engines):
    """A pi_0 annotator whose vLLM settings equal the sampler's shares the sampler's engine: pi_0
    is pushed before each judge read and the policy after it. The losses are those of two
    separate engines (fp32: to float rounding)."""
    from pofe.runs import read_jsonl
    from tests._cli import pofe

    own, own_dir = own_engines
    # the judge's context as the sampler's: one pooled engine
    shared = pofe("online", *_args(tmp_path, tiny64_dir, "shared", "judge.vllm.max_model_len=768"))
    assert shared.returncode == 0, shared.stderr[-2000:]
    ro, rs = (read_jsonl(d / "metrics.jsonl") for d in (own_dir, tmp_path / "shared"))
    assert len(ro) == len(rs) == 4
    assert [r["loss"] for r in rs] == pytest.approx([r["loss"] for r in ro], abs=1e-4)
    # the engine start-up line: the sampler's and the judge's, or the one they share
    assert own.stderr.count("vLLM engine for ") == 2 and shared.stderr.count("vLLM engine for ") == 1, (
        own.stderr.count("vLLM engine for "), shared.stderr.count("vLLM engine for "))

    # reference.source=engine on the shared engine: pi_0's log-probs read while it holds pi_0 for the
    # judge, the frozen copy freed, pi_0 pushed from its file after; killed after the switch, resumed alike
    eng_args = ("judge.vllm.max_model_len=768", "reference.source=engine")
    eng = pofe("online", *_args(tmp_path, tiny64_dir, "shared-engine", *eng_args))
    assert eng.returncode == 0, eng.stderr[-2000:]
    re_ = read_jsonl(tmp_path / "shared-engine" / "metrics.jsonl")
    assert re_[0]["reference/from_engine"] == 1.0 and re_[0]["reference/engine_gap"] < 1e-4
    assert [r["loss"] for r in re_] == pytest.approx([r["loss"] for r in ro], abs=1e-4)
    assert eng.stderr.count("vLLM engine for ") == 1
    crashed = pofe("online", *_args(tmp_path, tiny64_dir, "shared-crash", *eng_args), POFE_FAULT="3:after_judge")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    resumed = pofe("online", "--resume", str(tmp_path / "shared-crash"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["loss"] for r in read_jsonl(tmp_path / "shared-crash" / "metrics.jsonl")] == [r["loss"] for r in re_]


def test_a_model_loaded_by_embedded_name_gives_its_cache_folder_to_vllm(tiny64_dir, tokenizer, monkeypatch):
    """The engine loads from the converted cache of an embedded model (one path per model, so a
    sampler and a pi_0 annotator with the same settings pool one engine), not a fresh temp copy."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    import pofe.models
    from pofe.generation.vllm import _model_dir

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    model.config._name_or_path = "smollm2-135m-instruct"  # as load_model("smollm2-135m-instruct") leaves it
    monkeypatch.setattr(pofe.models, "ensure_embedded_cache", lambda name: tiny64_dir)
    assert _model_dir(model, tokenizer) == (str(tiny64_dir), None)
    model.config._name_or_path = "not-a-model-folder"  # anything else without a folder: a saved copy
    path, tmp = _model_dir(model, tokenizer)
    assert tmp is not None and path == tmp.name
    assert (Path(path) / "config.json").exists() and (Path(path) / "model.safetensors").exists()
    tmp.cleanup()


@pytest.mark.slow
def test_keep_frozen_false_reloads_the_frozen_weights_each_time(tiny64_dir, tokenizer):
    g0, gp, seqs = _shared_pi0_and_policy(tiny64_dir, tokenizer, keep_frozen=False)
    eng = g0.engine
    eng.can_keep, swaps = True, eng.swaps  # the pooled engine may have served an earlier test
    first = g0.completion_logprobs(seqs)
    g0.freeze()
    pol = gp.completion_logprobs(seqs)
    syncs = g0.syncs
    again = g0.completion_logprobs(seqs)
    assert g0._synced not in eng.frozen and (eng.kept is None or eng.kept.fp != g0._synced)
    assert eng.swaps == swaps and g0.syncs == syncs + 1  # pushed from its file, not swapped
    assert torch.allclose(torch.tensor(again), torch.tensor(first), atol=1e-5)
    assert torch.allclose(torch.tensor(gp.completion_logprobs(seqs)), torch.tensor(pol), atol=1e-5)


@pytest.mark.slow
def test_the_direct_push_gives_what_a_reload_gives_and_a_wrong_one_is_caught(tiny64_dir, tokenizer, monkeypatch,
                                                                             caplog):
    """The policy's push skips vLLM's reload machinery (pofe.generation.direct_push); its first use is
    compared with a reload of the same weights. Here: the engine's log-probs after a direct push equal
    those after a reload of the same weights; a direct push that puts other weights in place (one
    perturbed tensor) is caught on its first use, the path turned off, and the reload's weights read."""
    import pofe.generation.direct_push as D

    g0, gp, seqs = _shared_pi0_and_policy(tiny64_dir, tokenizer)
    eng = gp.engine
    assert eng.can_direct  # a CPU engine with full weights
    eng.direct_verified = False  # the pooled engine may have verified it for an earlier test
    with torch.no_grad():
        for p in gp.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    direct_lp = gp.completion_logprobs(seqs)  # first use: direct push, then the reload it is checked by
    assert eng.can_direct and eng.direct_verified
    with torch.no_grad():
        for p in gp.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    calls = []
    real_push = D.push
    monkeypatch.setattr(D, "push", lambda model, w: (calls.append(1), real_push(model, w)))
    direct_lp = gp.completion_logprobs(seqs)  # verified: the direct push alone
    direct_probe = eng._probe()
    assert calls == [1]
    eng.can_direct = False
    eng.load_full(gp._full_weights(), gp._want())  # a reload of the very same weights
    assert eng._probe() == direct_probe
    assert gp.completion_logprobs(seqs) == direct_lp

    def wrong(model, w):  # pushes one tensor changed: what a layout mismatch would do
        w = dict(w)
        w["model.norm.weight"] = w["model.norm.weight"] * 1.5
        real_push(model, w)

    monkeypatch.setattr(D, "push", wrong)
    eng.can_direct, eng.direct_verified = True, False
    with torch.no_grad():
        for p in gp.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    with caplog.at_level("WARNING", logger="pofe.generation.vllm"):
        caught = gp.completion_logprobs(seqs)
    assert not eng.can_direct and "direct weight push differs from a reload" in caplog.text
    eng.load_full(gp._full_weights(), gp._want())  # a plain reload (the path is off now)
    assert gp.completion_logprobs(seqs) == caught  # what was read after the catch was the reload's
