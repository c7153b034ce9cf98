"""``pofe annotate`` in a real headless Chromium (Debian's chromium + chromium-driver, driven
by Selenium): label pairs by keyboard, undo, reload and resume, skip, finish; then check the
JSONL and that ``pofe audit --calibration FILE`` reads it.

The only skip: no Chromium/ChromeDriver on this machine (CI's ``.ci/run`` installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.data.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

# Flags for a closed network: without the background-networking ones Chromium keeps trying
# (and failing) to reach Google's hosts.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,820")

LONG = "\n\n".join(f"Paragraph {i}: " + "this line of the answer keeps going so the box has to scroll. " * 4
                   for i in range(1, 13))
PAIRS = [
    {"prompt": "What is the boiling point of water at sea level?", "response_a": "100 °C (212 °F).",
     "response_b": "Water boils at 100 degrees Celsius at sea level; at altitude it boils at a lower temperature."},
    {"prompt": "Give me a long, structured answer about making bread.",
     "response_a": "## Steps\n\n1. Mix flour, water, salt and yeast.\n2. Knead for ten minutes.\n3. Let it rise.\n\n"
                   "```\noven = 230 C\n```\n" + LONG,
     "response_b": "- Mix\n- Knead\n- Bake\n\n    (indented by four spaces)\n\nDone."},
    {"prompt": "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned=2\">",
     "response_a": "<b>not bold</b> &amp; **not bold either**", "response_b": "<i>plain</i>\ttab"},
    {"prompt": "Name a prime number.", "response_a": "7", "response_b": "Seven is prime: its only divisors are 1 and 7."},
    {"prompt": "Translate 'thank you' into French.", "response_a": "Merci.", "response_b": "Merci beaucoup !"},
]


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("headless Chromium not found: install Debian's packages with "
                    "`apt-get install -y chromium chromium-driver` (CI's .ci/run does this)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture
def annotate_server(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in PAIRS), encoding="utf-8")
    out = tmp_path / "calibration.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pofe", "annotate", str(pairs), "--annotator", "ann", "-o", str(out),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    first = proc.stdout.readline()
    if not first.startswith("pofe annotate: http://127.0.0.1:"):
        proc.kill()
        pytest.fail(f"annotate did not start: {first!r} {proc.stderr.read()}")
    info = {"url": first.split(": ", 1)[1].strip(), "proc": proc, "out": out, "pairs": pairs}
    yield info
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_label_undo_reload_resume_and_audit(browser, annotate_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    wait = WebDriverWait(d, 20)

    def attr(name):
        return d.find_element(By.TAG_NAME, "body").get_attribute(f"data-{name}")

    def ready(decided):
        wait.until(lambda _: attr("decided") == str(decided) and attr("state") in ("ready", "done"))

    def text(el_id):  # exact characters, as the DOM holds them
        return d.execute_script("return document.getElementById(arguments[0]).textContent", el_id)

    def shown():
        return {"id": attr("pair-id"), "prompt": text("prompt"), "left": text("left"), "right": text("right")}

    def press(key, decided):
        d.find_element(By.TAG_NAME, "body").send_keys(key)
        ready(decided)

    d.get(annotate_server["url"])
    ready(0)
    assert d.find_element(By.ID, "progress-text").text == "0 labelled / 5"
    picks = {}  # pair id -> the text the person picked (or "tie")
    s1 = shown()
    assert s1["prompt"] == PAIRS[0]["prompt"] and {s1["left"], s1["right"]} == {PAIRS[0]["response_a"], PAIRS[0]["response_b"]}
    press("1", 1)
    picks[s1["id"]] = s1["left"]
    last = json.loads(annotate_server["out"].read_text(encoding="utf-8").splitlines()[-1])
    assert (last["event"], last["pair_id"], last["choice"]) == ("label", s1["id"], "left")  # on disk at once

    s2 = shown()
    assert s2["prompt"] == PAIRS[1]["prompt"]
    assert "\n\n1. Mix flour" in s2["left"] + s2["right"]  # whitespace and markdown kept as written
    long_box = "left" if s2["left"].startswith("## Steps") else "right"
    assert d.execute_script("const e = document.getElementById(arguments[0]); return e.scrollHeight > e.clientHeight",
                            long_box), "a long response should scroll inside its box"
    shot = tmp_path / "annotate.png"
    d.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("POFE_ANNOTATE_SCREENSHOT"):  # docs/img/annotate.png is made this way
        shutil.copy(shot, os.environ["POFE_ANNOTATE_SCREENSHOT"])
    press("2", 2)
    picks[s2["id"]] = s2["right"]

    s3 = shown()
    assert s3["prompt"] == PAIRS[2]["prompt"]  # markup shown as text ...
    assert d.execute_script("return document.getElementById('prompt').children.length") == 0
    assert d.execute_script("return window.pwned === undefined")  # ... and never run
    press("t", 3)
    press("u", 2)  # undo the tie: pair 3 is back
    assert shown() == s3 and "undid the label tie of pair 3" in d.find_element(By.ID, "status").text

    d.refresh()  # resume: the server says where this annotator is; the order is the same
    ready(2)
    assert shown() == s3
    assert d.find_element(By.ID, "progress-text").text == "2 labelled / 5"
    press("s", 3)  # skip pair 3

    s4 = shown()
    assert s4["prompt"] == PAIRS[3]["prompt"]
    press("1", 4)
    press(Keys.BACKSPACE, 3)  # Backspace undoes too (and does not navigate away)
    assert shown() == s4
    press("2", 4)
    picks[s4["id"]] = s4["right"]
    s5 = shown()
    press("t", 5)
    picks[s5["id"]] = "tie"
    assert attr("state") == "done" and "4 labelled and 1 skipped of 5" in d.find_element(By.ID, "done-text").text
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe  # no script errors, no Content-Security-Policy violations
    d.close()  # close the tab: the file already holds everything (the server is still running)

    out = annotate_server["out"]
    events = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [e["event"] for e in events] == ["open", "label", "label", "label", "undo", "skip", "label", "undo", "label",
                                            "label"]
    assert all(e["annotator"] == "ann" for e in events)
    items = load_calibration([out])
    assert [it.id for it in items] == [s1["id"], s2["id"], s4["id"], s5["id"]]
    for it in items:
        if picks[it.id] == "tie":
            assert it.label == "tie"
        else:  # the calibration item prefers exactly the text that was on the side picked
            assert (it.response_a if it.label == "A" else it.response_b) == picks[it.id]

    proc = annotate_server["proc"]
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "ann: 4 labelled, 1 skipped of 5" in rest

    report = tmp_path / "audit.json"
    r = CliRunner().invoke(app, ["audit", "--calibration", str(out), "--judge", "length", "--set", "contrasts=false",
                                 "-o", str(report)])
    assert r.exit_code in (0, 1), r.output  # 1 = the length judge fails its checks, as it should
    rep = json.loads(report.read_text())
    assert rep["calibration"]["n_items"] == 4
    assert rep["metrics"]["n_labelled"] == 3 and rep["metrics"]["human_ties"]["n"] == 1
