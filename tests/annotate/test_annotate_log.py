"""The annotate event log and its reader: labels, undo, skip, resume, two annotators,
torn tails, and the calibration items ``pofe audit`` gets from the file."""

from __future__ import annotations

import json

import pytest

from pofe.annotate.log import EventLog
from pofe.annotate.pairs import load_pairs, shown_swapped
from pofe.annotate.server import AnnotateConfig, BadRequest, Conflict, Session
from pofe.data.calibration import from_annotations, load_calibration, resolve_annotation_events
from pofe.data.prompts import DataError


def _label(who, pid, label, a="x", b="y", prompt="p"):
    return {"event": "label", "annotator": who, "pair_id": pid, "label": label, "prompt": prompt,
            "response_a": a, "response_b": b}


def test_resolve_undo_skip_and_relabel_by_hand():
    rows = [
        {"event": "open", "annotator": "ann"},
        _label("ann", "p1", "A"),
        _label("ann", "p2", "B"),
        {"event": "undo", "annotator": "ann", "pair_id": "p2"},  # withdraws p2's B
        _label("ann", "p2", "tie"),
        {"event": "skip", "annotator": "ann", "pair_id": "p3"},
        _label("ann", "p4", "A"),
        {"event": "undo", "annotator": "ann", "pair_id": "p4"},
        {"event": "undo", "annotator": "ann", "pair_id": "p3"},  # undo the skip: p3 is open again
        _label("ann", "p1", "B"),  # a second decision on p1 replaces the first
    ]
    standing = resolve_annotation_events(rows, "f.jsonl")
    assert [(d["pair_id"], d["event"], d.get("label")) for d in standing] == [("p2", "label", "tie"), ("p1", "label", "B")]
    items = from_annotations(rows, "f.jsonl")
    assert [(it.id, it.label, it.source) for it in items] == [("p2", "tie", "ann@f.jsonl"), ("p1", "B", "ann@f.jsonl")]


def test_resolve_errors_name_the_line():
    with pytest.raises(ValueError, match=r"f\.jsonl:3: undo of pair 'p2' by 'ann', who has no standing decision on it"):
        resolve_annotation_events([_label("ann", "p1", "A"), _label("bob", "p2", "A"),
                                   {"event": "undo", "annotator": "ann", "pair_id": "p2"}], "f.jsonl")
    with pytest.raises(ValueError, match=r"f\.jsonl:1: unknown event 'lable'"):
        resolve_annotation_events([{"event": "lable", "annotator": "ann"}], "f.jsonl")
    with pytest.raises(ValueError, match=r"f\.jsonl:1: label must be 'A', 'B' or 'tie'"):
        resolve_annotation_events([_label("ann", "p1", "C")], "f.jsonl")
    with pytest.raises(ValueError, match=r"f\.jsonl:1: label event without a 'response_b' string"):
        resolve_annotation_events([{**_label("ann", "p1", "A"), "response_b": None}], "f.jsonl")


def test_two_annotators_keep_separate_undo_stacks_and_share_pair_ids():
    rows = [_label("ann", "p1", "A"), _label("bob", "p1", "B"), {"event": "undo", "annotator": "ann", "pair_id": "p1"},
            _label("ann", "p1", "A"), _label("bob", "p2", "tie")]
    items = from_annotations(rows, "f.jsonl")
    assert sorted((it.source, it.id, it.label) for it in items) == [
        ("ann@f.jsonl", "p1", "A"), ("bob@f.jsonl", "p1", "B"), ("bob@f.jsonl", "p2", "tie")]


def _pairs(tmp_path, n=4):
    rows = [{"prompt": f"question {i}", "response_a": f"short answer {i}", "response_b": f"a much longer answer number {i}"}
            for i in range(n)]
    rows.append({"prompt": "hi", "chosen": "Hello! How can I help?", "rejected": "What."})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _session(tmp_path, who="ann", seed=0):
    return Session(AnnotateConfig(data={"pairs": str(tmp_path / "pairs.jsonl")}, annotator=who,
                                  output=str(tmp_path / "cal.jsonl"), seed=seed))


def test_session_labels_map_the_shown_side_back_to_the_pair(tmp_path):
    _pairs(tmp_path)
    s = _session(tmp_path)
    seen = []
    for choice in ("left", "right", "tie", "left", "right"):
        st = s.state()
        assert st == s.state()  # the same pair and order on every read (a reload)
        seen.append((st["pair"], choice))
        s.decide(st["pair"]["id"], choice)
    assert s.state()["done"] and s.counts() == {"total": 5, "labelled": 5, "skipped": 0}
    items = load_calibration([tmp_path / "cal.jsonl"])  # the audit's own loader
    assert len(items) == 5
    for (shown, choice), it in zip(seen, items):
        assert it.id == shown["id"]
        if choice == "tie":
            assert it.label == "tie"
        else:  # the text the person picked is the text the calibration item marks as better
            picked = shown["left"] if choice == "left" else shown["right"]
            assert (it.response_a if it.label == "A" else it.response_b) == picked
    assert {it.source for it in items} == {f"ann@{tmp_path.name}/cal.jsonl"}


def test_session_undo_skip_and_resume_from_the_file(tmp_path):
    _pairs(tmp_path)
    s = _session(tmp_path)
    first = s.state()["pair"]["id"]
    s.decide(first, "left")
    second = s.state()["pair"]["id"]
    s.decide(second, "skip")
    third = s.state()["pair"]["id"]
    s.decide(third, "tie")
    st = s.undo()  # withdraws the tie on the third pair
    assert st["pair"]["id"] == third and st["labelled"] == 1 and st["skipped"] == 1
    assert "undid the label tie of pair 3" in st["note"]
    with pytest.raises(Conflict, match="already decided"):
        s.decide(first, "right")
    with pytest.raises(BadRequest, match="unknown pair id 'nope'"):
        s.decide("nope", "left")
    with pytest.raises(BadRequest, match="choice must be one of"):
        s.decide(third, "3")
    s.close()
    # A new server on the same file: same progress, same next pair, same left/right order.
    again = _session(tmp_path)
    st2 = again.state()
    assert (st2["labelled"], st2["skipped"], st2["pair"]["id"]) == (1, 1, third)
    assert st2["pair"] == st["pair"]
    again.undo()  # undo reaches back across the restart: the skip of pair 2
    assert again.state()["pair"]["id"] == second
    again.close()
    events = [json.loads(x)["event"] for x in (tmp_path / "cal.jsonl").read_text().splitlines()]
    assert events == ["label", "skip", "label", "undo", "undo"]  # open events are written by make_server


def test_two_annotators_on_one_file(tmp_path):
    _pairs(tmp_path, n=2)
    a, b = _session(tmp_path, "ann"), _session(tmp_path, "bob")
    for s, choice in ((a, "left"), (b, "right"), (a, "tie"), (b, "tie"), (a, "skip")):
        s.decide(s.state()["pair"]["id"], choice)
    a.close(), b.close()
    assert _session(tmp_path, "ann").counts() == {"total": 3, "labelled": 2, "skipped": 1}
    assert _session(tmp_path, "bob").counts() == {"total": 3, "labelled": 2, "skipped": 0}
    items = load_calibration([tmp_path / "cal.jsonl"])
    by_pair: dict[str, dict[str, str]] = {}
    for it in items:
        by_pair.setdefault(it.id, {})[it.source.split("@")[0]] = it.label
    pairs, _ = load_pairs(tmp_path / "pairs.jsonl")
    p0, p1 = pairs[0], pairs[1]
    # ann pressed "left" on pair 0, bob "right": same text only if their orders differ.
    same = shown_swapped(p0.id, "ann") != shown_swapped(p0.id, "bob")
    assert (by_pair[p0.id]["ann"] == by_pair[p0.id]["bob"]) == same
    assert by_pair[p1.id] == {"ann": "tie", "bob": "tie"}


def test_display_order_is_random_across_pairs_and_annotators():
    flips = [shown_swapped(f"pair{i}", who) for i in range(200) for who in ("ann", "bob")]
    assert 160 < sum(flips) < 240  # about half (binomial sd 10)
    assert shown_swapped("pair1", "ann", seed=0) == shown_swapped("pair1", "ann", seed=0)


def test_event_log_cuts_a_torn_last_line(tmp_path, caplog):
    path = tmp_path / "cal.jsonl"
    good = json.dumps(_label("ann", "p1", "A"))
    path.write_text(good + "\n" + '{"event": "label", "annot')
    log = EventLog(path)
    assert "dropping a torn last line" in caplog.text
    log.append({"event": "skip", "annotator": "ann", "pair_id": "p2"})
    log.close()
    lines = path.read_text().splitlines()
    assert lines[0] == good and json.loads(lines[1])["event"] == "skip" and len(lines) == 2
    # A whole event missing only its newline is kept.
    path.write_text(good)
    EventLog(path).close()
    assert path.read_text() == good + "\n"


def test_load_pairs_formats_and_errors(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"kind": "annotation", "pair_id": "s0-0", "prompt": "q", "response_a": "a", "response_b": "b", "p": None},
        {"kind": "loss", "pair_id": "s0-0", "loss": 0.7},  # a ledger's per-pair loss row: not a pair
        {"prompt": "q", "chosen": "c", "rejected": "c"},  # identical responses
        {"prompt": "q2", "chosen": [{"role": "assistant", "content": "yes"}], "rejected": [{"role": "assistant", "content": "no"}]},
        {"prompt": "q", "response_a": "b", "response_b": "a"},  # the first pair again, other order, no id
        {"prompt": "q", "response_a": "b", "response_b": "a", "id": "other"},  # ... and under another id
        {"prompt": "q", "response_a": "b", "response_b": "new"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, skipped = load_pairs(path)
    assert len(pairs) == 3 and pairs[0].id == "s0-0" and (pairs[2].response_a, pairs[2].response_b) == ("b", "new")
    assert skipped == {"other-row-kind": 1, "identical": 1, "duplicate": 2}
    cr = pairs[1]
    assert cr.prompt == "q2" and {cr.response_a, cr.response_b} == {"yes", "no"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "response_a": "a"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: field 'response_b' must be a string"):
        load_pairs(bad)
    clash = tmp_path / "clash.jsonl"
    clash.write_text(json.dumps({"id": 7, "prompt": "q", "response_a": "a", "response_b": "b"}) + "\n"
                     + json.dumps({"id": 7, "prompt": "q", "response_a": "a", "response_b": "c"}) + "\n")
    with pytest.raises(DataError, match=r"clash\.jsonl:2: pair id '7' is also used by a different pair at .*clash\.jsonl:1"):
        load_pairs(clash)
    with pytest.raises(DataError, match="pairs file not found"):
        load_pairs(tmp_path / "missing.jsonl")


def test_chosen_rejected_pairs_are_not_all_chosen_first(tmp_path):
    path = tmp_path / "cr.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}) + "\n"
                            for i in range(100)))
    pairs, _ = load_pairs(path)
    first = sum(p.response_a.startswith("good") for p in pairs)
    assert 30 < first < 70  # a random order per pair, not the file's chosen-first convention
    assert [p.response_a for p in load_pairs(path)[0]] == [p.response_a for p in pairs]  # and a fixed one


def test_load_pairs_reads_pofe_label_output_and_hh_dialogues(tmp_path):
    from pofe.loops.label import label_row
    from pofe.records import Judgment

    j = Judgment(p=0.7, p_ab=0.8, p_ba=0.6, consistent=True, parse_ok=True, judge_id="length")
    rows = [label_row("Name a colour.", "Blue.", "Green is a colour.", j),
            {"chosen": "\n\nHuman: Say hi.\n\nAssistant: Hello there!", "rejected": "\n\nHuman: Say hi.\n\nAssistant: No."}]
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, skipped = load_pairs(path)
    assert skipped == {}
    assert (pairs[0].prompt, pairs[0].response_a, pairs[0].response_b) == ("Name a colour.", "Blue.", "Green is a colour.")
    assert pairs[1].prompt == "Say hi." and {pairs[1].response_a, pairs[1].response_b} == {"Hello there!", "No."}


def test_limit_picks_the_same_subset_for_every_annotator(tmp_path):
    _pairs(tmp_path, n=30)
    cfg = dict(data={"pairs": str(tmp_path / "pairs.jsonl"), "limit": 8}, output=str(tmp_path / "cal.jsonl"))
    a = Session(AnnotateConfig(annotator="ann", **cfg))
    b = Session(AnnotateConfig(annotator="bob", **cfg))
    other = Session(AnnotateConfig(annotator="ann", seed=1, **cfg))
    ids = [p.id for p in a.pairs]
    assert len(ids) == 8 and ids == [p.id for p in b.pairs] and ids != [p.id for p in other.pairs]
    everything = [p.id for p in load_pairs(tmp_path / "pairs.jsonl")[0]]
    assert ids == [i for i in everything if i in set(ids)]  # file order kept
    assert a.counts()["total"] == 8 and a.n_in_file == 31
    with pytest.raises(ValueError, match="limit 0: give at least 1"):
        AnnotateConfig(annotator="ann", **{**cfg, "data": {**cfg["data"], "limit": 0}})


def test_undo_after_labelling_another_file_in_between(tmp_path):
    """ann labels file 1, then file 2, then goes back to file 1 and undoes: the undo targets
    file 1's last pair and the log still reads (file 2's later label stands)."""
    _pairs(tmp_path, n=2)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "x?", "response_a": "yes", "response_b": "no"}) + "\n")
    s = _session(tmp_path)
    first = s.state()["pair"]["id"]
    s.decide(first, "left")
    s.close()
    o = Session(AnnotateConfig(data={"pairs": str(other)}, annotator="ann", output=str(tmp_path / "cal.jsonl")))
    o.decide(o.state()["pair"]["id"], "right")
    o.close()
    back = _session(tmp_path)
    assert back.foreign == 1 and back.counts()["labelled"] == 1
    assert back.undo()["pair"]["id"] == first
    back.close()
    items = load_calibration([tmp_path / "cal.jsonl"])
    assert [it.prompt for it in items] == ["x?"]
