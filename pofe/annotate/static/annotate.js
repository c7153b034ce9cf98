// pofe annotate: the labelling page. Plain JS, no build step, no CDN.
// Every piece of pair text goes through textContent (never innerHTML), so prompts and
// responses are shown as the exact characters they are: markup and markdown stay visible
// source, scripts in them never run.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let state = null;
  let busy = false;

  function setStatus(text, isError) {
    const el = $("status");
    el.textContent = text || "";
    el.classList.toggle("error", !!isError);
  }

  function render(s) {
    state = s;
    $("annotator").textContent = s.annotator;
    const decided = s.labelled + s.skipped;
    $("progress").max = Math.max(1, s.total);
    $("progress").value = decided;
    $("progress-text").textContent =
      s.labelled + " labelled" + (s.skipped ? ", " + s.skipped + " skipped" : "") + " / " + s.total;
    document.querySelectorAll("[data-action=undo]").forEach((b) => { b.disabled = !s.can_undo; });
    if (s.pair) {
      $("task").hidden = false;
      $("done").hidden = true;
      $("pair-meta").textContent = "pair " + s.pair.index + " of " + s.total + " · id " + s.pair.id;
      $("prompt").textContent = s.pair.prompt;
      $("left").textContent = s.pair.left;
      $("right").textContent = s.pair.right;
      ["prompt", "left", "right"].forEach((id) => { $(id).scrollTop = 0; });
      document.body.dataset.pairId = s.pair.id;
      document.body.dataset.state = "ready";
    } else {
      $("task").hidden = true;
      $("done").hidden = false;
      $("done-text").textContent = s.labelled + " labelled and " + s.skipped + " skipped of " + s.total +
        " pairs, saved in " + s.output + ".";
      document.body.dataset.pairId = "";
      document.body.dataset.state = "done";
    }
    document.body.dataset.decided = String(decided);
    setStatus(s.note || "", false);
  }

  async function call(method, path, body) {
    const opts = { method: method, headers: {} };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      throw new Error((data && data.error) || ("HTTP " + r.status));
    }
    return data;
  }

  async function act(method, path, body) {
    if (busy) return;
    busy = true;
    document.body.dataset.state = "busy";
    try {
      render(await call(method, path, body));
    } catch (e) {
      // Show the error and re-read the server's state: the page never guesses what was saved.
      try { render(await call("GET", "/api/state")); } catch (e2) { /* keep the old view */ }
      setStatus("Not saved: " + e.message, true);
    } finally {
      busy = false;
      if (document.body.dataset.state === "busy") document.body.dataset.state = "ready";
    }
  }

  function decide(choice) {
    if (!state || !state.pair) return;
    act("POST", "/api/decide", { pair_id: state.pair.id, choice: choice });
  }

  function undo() {
    if (!state || !state.can_undo) return;
    act("POST", "/api/undo", {});
  }

  const KEYS = { "1": "left", "2": "right", "t": "tie", "s": "skip" };

  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.repeat) return;
    const k = ev.key.length === 1 ? ev.key.toLowerCase() : ev.key;
    if (k in KEYS) {
      ev.preventDefault();
      decide(KEYS[k]);
    } else if (k === "u" || k === "Backspace") {
      ev.preventDefault();  // Backspace must never navigate away
      undo();
    }
  });

  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("button");
    if (!b) return;
    b.blur();  // keep keyboard focus on the page, not the button (Space/Enter would re-click)
    if (b.dataset.choice) decide(b.dataset.choice);
    else if (b.dataset.action === "undo") undo();
  });

  // Resume: the server knows the next pair this annotator has not decided.
  act("GET", "/api/state");
})();
