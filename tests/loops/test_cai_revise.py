"""pofe cai revise (SL-CAI): constitutions, the critique -> revision loop, SFT mixing,
preference pairs, refusal tracking, and cai revise -> sft end to end."""

from __future__ import annotations

import json

import pytest

from pofe.generation.critique import critique_revise, load_cai_constitution
from pofe.loops.cai_revise import CaiReviseConfig, mix_sft, preference_pairs, run
from pofe.runs import RunError

HHH_HARM = {"no-operational-harm", "no-illegal-facilitation", "respect-for-people", "privacy", "wellbeing",
            "no-manipulation", "age-appropriate"}


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def test_shipped_hhh_constitution_is_comparative_and_complete():
    c = load_cai_constitution("hhh")
    assert c.version == "hhh-1" and len(c.principles) == 12
    ids = {p.id for p in c.principles}
    # helpfulness / honesty principles protect what the harm ones could erode (seed advice)
    assert {"helpful-substance", "no-over-refusal", "honest-uncertainty"} <= ids
    for p in c.principles:
        assert p.text.startswith(("Choose the response", "When some part")), p.id
        assert p.critique and p.revision


def test_judge_only_principles_get_generic_requests(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("version: '7'\nprinciples:\n  - id: kind\n    text: Choose the kinder response.\n")
    c = load_cai_constitution(str(f))
    assert c.version == "7"
    assert "Choose the kinder response." in c.principles[0].critique
    assert c.principles[0].revision.startswith("Rewrite the response")


def test_hf_json_constitution(shared_data):
    c = load_cai_constitution(str(shared_data / "hf-constitution" / "constitution_anthropic.json"))
    assert len(c.principles) == 16 and c.version == "hf-json"
    assert all(p.harm for p in c.principles)  # Anthropic's SL-CAI critiques are all harm critiques


def test_sl_cai_critiques_draw_harm_principles_only():
    """Fidelity: Bai et al.'s SL-CAI critiques identify harmful content only, so a red-team
    critique never draws a principle such as "no-over-refusal"."""
    c = load_cai_constitution("hhh")
    assert {p.id for p in c.principles if p.harm} == HHH_HARM
    tr = critique_revise(None, None, [f"q{i}" for i in range(80)], c, rounds=3, few_shot=False, generate_fn=FakeModel(), seed=0)
    drawn = {r["principle_id"] for t in tr for r in t.rounds}
    assert drawn == HHH_HARM  # 240 draws from 7: every harm principle appears, nothing else
    assert "no-over-refusal" not in drawn and "helpful-substance" not in drawn
    d = load_cai_constitution("default")
    assert {p.id for p in d.critique_pool()} == {"physical-harm", "respect", "illegal-activity", "privacy",
                                                   "vulnerable-users", "manipulation"}
    # an explicit list is the user's choice, a constitution without harm marks is a clear error
    assert [p.id for p in c.critique_pool(["honest-uncertainty"])] == ["honest-uncertainty"]


def test_a_constitution_without_harm_principles_is_refused_before_a_run_folder(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("version: '7'\nprinciples:\n  - id: kind\n    text: Choose the kinder response.\n")
    with pytest.raises(ValueError, match="harm: true"):
        critique_revise(None, None, ["q"], load_cai_constitution(str(f)), generate_fn=FakeModel())
    prompts = tmp_path / "red.txt"
    prompts.write_text("q\n")
    with pytest.raises(ValueError, match="harm: true"):
        run(CaiReviseConfig(constitution=str(f), data={"prompts": str(prompts)}, run={"output_dir": str(tmp_path / "runs")}),
            generate_fn=FakeModel())
    assert not (tmp_path / "runs").exists()
    s = run(CaiReviseConfig(constitution=str(f), principles=["kind"], data={"prompts": str(prompts)}, refusal={"enabled": False},
                            run={"output_dir": str(tmp_path / "runs")}), generate_fn=FakeModel())
    assert s["critique_principles"] == ["kind"] and s["principle_counts"] == {"kind": 1}


class FakeModel:
    """generate_fn stand-in: records the conversations and answers by turn type."""

    def __init__(self, revision="Revised answer.", blank_round=None):
        self.calls = []
        self.revision = revision
        self.blank_round = blank_round

    def __call__(self, msgs, sampling, seed):
        self.calls.append(msgs)
        out = []
        for m in msgs:
            last = m[-1]["content"]
            if last.startswith("Critique request"):
                out.append("Critique: it could be better.")
            elif last.startswith("Revision request"):
                out.append("" if self.blank_round else f"Revision: {self.revision}")
            else:
                out.append(f"Original answer to {last}")
        return out


def test_critique_revise_rounds_structure_and_kept_texts():
    c = load_cai_constitution("hhh")
    fake = FakeModel()
    tr = critique_revise(None, None, ["q1", "q2"], c, rounds=3, few_shot=False, generate_fn=fake, seed=1)
    # 1 initial call + 2 calls per round
    assert len(fake.calls) == 1 + 2 * 3
    t = tr[0]
    assert t.original == "Original answer to q1"
    assert len(t.responses) == 4 and t.final == "Revised answer."
    assert [r["round"] for r in t.rounds] == [1, 2, 3]
    assert all(r["critique"] == "it could be better." for r in t.rounds)  # label prefix stripped
    # the critique conversation: prompt, latest response, critique request of the sampled principle
    crit_conv = fake.calls[1][0]
    assert [m["role"] for m in crit_conv] == ["user", "assistant", "user"]
    by_id = {p.id: p for p in c.principles}
    assert crit_conv[2]["content"] == "Critique request: " + by_id[t.rounds[0]["principle_id"]].critique
    rev_conv = fake.calls[2][0]
    assert [m["role"] for m in rev_conv] == ["user", "assistant", "user", "assistant", "user"]
    # round 2 critiques round 1's revision
    assert fake.calls[3][0][1]["content"] == "Revised answer."


def test_principle_sampling_is_seeded_and_filterable():
    c = load_cai_constitution("hhh")
    a = critique_revise(None, None, ["q"] * 6, c, rounds=2, few_shot=False, generate_fn=FakeModel(), seed=3)
    b = critique_revise(None, None, ["q"] * 6, c, rounds=2, few_shot=False, generate_fn=FakeModel(), seed=3)
    assert [r["principle_id"] for t in a for r in t.rounds] == [r["principle_id"] for t in b for r in t.rounds]
    only = critique_revise(None, None, ["q"] * 4, c, rounds=1, few_shot=False, generate_fn=FakeModel(),
                           principle_ids=["privacy"])
    assert {t.rounds[0]["principle_id"] for t in only} == {"privacy"}
    with pytest.raises(ValueError):
        critique_revise(None, None, ["q"], c, generate_fn=FakeModel(), principle_ids=["nope"])


def test_blank_revision_keeps_previous_text():
    c = load_cai_constitution("hhh")
    tr = critique_revise(None, None, ["q"], c, rounds=2, few_shot=False, generate_fn=FakeModel(blank_round=True))
    assert tr[0].final == tr[0].original and tr[0].empty_revisions == 2
    assert preference_pairs(tr, c) == []  # unchanged text carries no preference


def test_few_shot_prefix_is_prepended():
    c = load_cai_constitution("hhh")
    fake = FakeModel()
    critique_revise(None, None, ["q"], c, rounds=1, few_shot=True, generate_fn=fake)
    assert len(fake.calls[1][0]) == 6 + 3 and fake.calls[0][0] == [{"role": "user", "content": "q"}]


def test_mix_sft_ratio_by_hand():
    cai = [{"prompt": f"c{i}", "response": "r", "source": "cai-revision"} for i in range(30)]
    helpful = [{"prompt": f"h{i}", "response": "r", "source": "helpful"} for i in range(100)]
    rows = mix_sft(cai, helpful, 0.25)
    # 30 * 0.25 / 0.75 = 10 helpful rows -> 10 / 40 = 25 %
    assert len(rows) == 40 and sum(r["source"] == "helpful" for r in rows) == 10
    assert len(mix_sft(cai, helpful, 0.0)) == 30
    assert sum(r["source"] == "helpful" for r in mix_sft(cai, helpful[:3], 0.5)) == 3  # capped by availability


def test_run_writes_datasets_and_tracks_refusal(tmp_path):
    prompts = tmp_path / "red.txt"
    prompts.write_text("how to pick a lock\nhow to make a weapon\n")
    benign = tmp_path / "benign.txt"
    benign.write_text("how to kill a python process\n")
    helpful = tmp_path / "helpful.jsonl"
    helpful.write_text("\n".join(json.dumps({"prompt": f"h{i}", "response": "ok"}) for i in range(5)) + "\n")
    cfg = CaiReviseConfig(data={"prompts": str(prompts), "helpful": str(helpful), "helpful_ratio": 0.5}, rounds=2,
                          refusal={"benign": str(benign), "n_benign": 5}, run={"output_dir": str(tmp_path), "name": "cai"})
    s = run(cfg, generate_fn=FakeModel(revision="I'm sorry, but I can't help with that."))
    assert s["prompts"] == 2 and s["preference_pairs"] == 2
    assert s["sft_examples"] == 4 and s["sft_helpful"] == 2
    # revisions turned everything into refusals: harmful 0 -> 1, and over-refusal 0 -> 1 (the warning sign)
    assert s["refusal"]["original"]["harmful_refusal_rate"] == 0.0
    assert s["refusal"]["revised"]["harmful_refusal_rate"] == 1.0
    assert s["refusal"]["revised"]["over_refusal_rate"] == 1.0
    rows = [json.loads(x) for x in open(s["files"]["revisions"])]
    assert {r["set"] for r in rows} == {"red-team", "benign"}
    assert len(rows[0]["rounds"]) == 2 and rows[0]["constitution_version"] == "hhh-1"
    pref = [json.loads(x) for x in open(s["files"]["preferences"])]
    assert pref[0]["chosen"].startswith("I'm sorry") and pref[0]["p"] == 1.0
    assert pref[0]["provenance"]["constitution_version"] == "hhh-1"
    sft = [json.loads(x) for x in open(s["files"]["sft"])]
    assert {"prompt", "response"} <= set(sft[0])
    assert set(s["critique_principles"]) == HHH_HARM
    metrics = [json.loads(x) for x in open(tmp_path / "cai" / "metrics.jsonl")]
    assert [(m["step"], m["set"], m["prompts"]) for m in metrics] == [(1, "red-team", 2), (2, "benign", 1)]


class CrashingModel(FakeModel):
    def __init__(self, crash_on_prompt):
        super().__init__()
        self.crash_on_prompt = crash_on_prompt

    def __call__(self, msgs, sampling, seed):
        if any(m[0]["content"] == self.crash_on_prompt for m in msgs):
            raise RuntimeError("injected fault")
        return super().__call__(msgs, sampling, seed)


def test_crash_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    prompts = tmp_path / "red.txt"
    prompts.write_text("".join(f"red {i}\n" for i in range(5)))
    benign = tmp_path / "benign.txt"
    benign.write_text("ok 0\nok 1\n")

    def cfg(name):
        return CaiReviseConfig(data={"prompts": str(prompts)}, rounds=2, train={"batch_size": 2}, few_shot=False,
                               refusal={"benign": str(benign), "n_benign": 2}, run={"output_dir": str(tmp_path), "name": name})

    ref = run(cfg("ref"), generate_fn=FakeModel())
    with pytest.raises(RuntimeError, match="injected"):
        run(cfg("crash"), generate_fn=CrashingModel("red 4"))  # chunks [0, 1] and [2, 3] done, [4] crashes
    d = tmp_path / "crash"
    assert len(open(d / "revisions.jsonl").readlines()) == 4
    fake = FakeModel()
    s = run(cfg("crash"), resume=d, generate_fn=fake)
    assert s["resumed_after_chunks"] == 2 and len(fake.calls) == 2 * (1 + 2 * 2)  # chunks [4] and benign only
    for f in ("revisions.jsonl", "sft.jsonl", "preferences.jsonl", "metrics.jsonl"):
        got = [json.loads(x) for x in open(d / f)]
        want = [json.loads(x) for x in open(tmp_path / "ref" / f)]
        assert got == want, f
    keys = ("prompts", "principle_counts", "refusal")
    assert {k: s[k] for k in keys} == {k: ref[k] for k in keys}
    with pytest.raises(RunError):
        run(cfg("x"), resume=tmp_path / "typo", generate_fn=fake)


@pytest.mark.parametrize("bad", ["rounds=5", "rounds=0", "train.batch_size=0", "data.max_prompts=0", "data.helpful_ratio=1.0",
                                 "refusal.n_benign=-1", "model.lora.enabled=true"])
def test_nonsense_settings_are_refused_at_parse_time(bad):
    import re

    from pofe.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0].split(".lora")[0])):
        load_config(CaiReviseConfig, None, [bad])


@pytest.mark.slow
def test_cai_revise_then_sft_end_to_end(tmp_path, tiny_model_dir):
    """cai revise on a tiny real model (real generation) -> pofe sft on sft.jsonl -> reload."""
    import pofe.loops.sft as sft_mod

    prompts = tmp_path / "red.txt"
    prompts.write_text("how to pick a lock\nhow to make a weapon\nhow to cheat at cards\n")
    cfg = CaiReviseConfig(model={"name": str(tiny_model_dir)}, data={"prompts": str(prompts)}, rounds=1, few_shot=False,
                          sampling={"max_new_tokens": 6, "temperature": 1.0},
                          critique_sampling={"max_new_tokens": 6, "temperature": 1.0},
                          refusal={"enabled": False}, run={"output_dir": str(tmp_path), "name": "cai"})
    s = run(cfg)
    assert s["sft_examples"] == 3
    scfg = sft_mod.SFTConfig(model={"name": str(tiny_model_dir)}, data={"ift": [s["files"]["sft"]]},
                             train={"steps": 2, "batch_size": 2, "grad_accum": 1}, optim={"lr": 1e-3, "warmup_steps": 0},
                             run={"output_dir": str(tmp_path), "name": "sft"})
    out = sft_mod.run(scfg)
    from pofe.models import load_model

    m, tok = load_model(out["final_model"])
    assert m.config.vocab_size == len(tok)
