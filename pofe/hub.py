"""Hub-ready outputs: the model card every ``final/`` gets (``final/README.md``) and the push of
``final/`` (``run.push_to_hub``, ``--push-to-hub REPO``) or of ``pofe export``'s output to the
Hugging Face Hub.

The card (:func:`model_card`) is written by the driver (:mod:`pofe.recipe`) once ``summary.json``
exists, so every command that writes ``final/`` gets one from the same function. Its YAML front matter (what the
Hub indexes: ``base_model``, ``library_name``, ``tags``) is written with ``yaml.safe_dump``, so a
value from a config or a data file can never break out of it; the body is Markdown.

A push goes through ``huggingface_hub`` (``HfApi.create_repo(exist_ok=True)`` then
``upload_folder`` / ``upload_file``) with its usual token lookup (``HF_TOKEN``, ``hf auth
login``) and ``HF_ENDPOINT`` read when the push starts. What can be known before a run (offline
mode, no token) is refused by :func:`check_push` before any model loads; a push that fails after
the run is one :class:`HubPushError` line naming the repo, and the run folder stays complete.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pofe.errors import PofeError

# A Hub repo id: ``name`` or ``namespace/name`` (letters, digits, ``-_.``; at most 96 characters
# each, no ``--`` or ``..``, not starting or ending with ``-`` or ``.``: huggingface_hub's rules).
_REPO_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"^(?:{_REPO_PART}/)?{_REPO_PART}$")

# The embedded models' Hub originals (pofe.models.EMBEDDED_MODELS ships them as GGUF)
EMBEDDED_ORIGINS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}

CARD = "README.md"


class HubPushError(PofeError):
    """A push to the Hugging Face Hub that failed (no token, offline, refused, unreachable): one
    line naming the repo; what was written locally stays. Exit 1 (the environment)."""

    exit_code = 1


class HubConfigError(PofeError):
    """A push that cannot work, found before the run (offline mode, no token, a bad repo id): exit 2."""

    exit_code = 2


def check_repo_id(value: str) -> str:
    """``value`` if it is a Hub repo id (``name`` or ``namespace/name``), else ValueError (for a validator)."""
    if not _REPO_ID.match(value) or "--" in value or ".." in value:
        raise ValueError(f"{value!r} is not a Hugging Face repo id (namespace/name: letters, digits, '-', '_', '.')")
    return value


def check_push(repo: str, key: str = "run.push_to_hub") -> None:
    """Refuse, before any work, a push that cannot happen: offline mode, or no token found."""
    from huggingface_hub import constants, get_token

    if constants.is_offline_mode():
        raise HubConfigError(f"{key} {repo}: HF_HUB_OFFLINE is set, so nothing can be pushed (unset it, or drop "
                             f"{key})")
    if not get_token():
        raise HubConfigError(f"{key} {repo}: no Hugging Face token (set HF_TOKEN or run `hf auth login`)")


def _api():
    from huggingface_hub import HfApi

    # read now, not at import: huggingface_hub fixes its default endpoint when first imported
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def _failed(repo: str, local: Path, e: BaseException) -> HubPushError:
    status = getattr(getattr(e, "response", None), "status_code", None)
    why = f"HTTP {status}" if status else type(e).__name__
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return HubPushError(f"push to the Hugging Face Hub repo {repo} failed ({why}{': ' + first if first else ''}); "
                        f"{local} is complete locally: push it later with `hf upload {repo} {local}`")


def push(path: str | Path, repo: str, *, repo_type: str = "model", message: str = "Upload from pofe") -> dict[str, Any]:
    """Upload ``path`` (a folder's files at the repo's root, or one file) to ``repo``, creating the
    repo when missing. Returns ``{"repo", "repo_type", "url", "commit"}``; a failure is one
    :class:`HubPushError` line."""
    path = Path(path)
    try:
        api = _api()
        url = api.create_repo(repo, repo_type=repo_type, exist_ok=True)
        if path.is_dir():
            info = api.upload_folder(repo_id=repo, folder_path=str(path.resolve()), repo_type=repo_type,
                                     commit_message=message)
        else:
            info = api.upload_file(path_or_fileobj=str(path), path_in_repo=path.name, repo_id=repo,
                                   repo_type=repo_type, commit_message=message)
    except Exception as e:  # noqa: BLE001 - HTTP, auth, network, offline: one line naming the repo
        raise _failed(repo, path, e) from None
    return {"repo": repo, "repo_type": repo_type, "url": str(url), "commit": getattr(info, "oid", None)}


# ----------------------------------------------------------------------------- the model card

# (label, path in summary.json, path of its 95% interval or None), per command: the numbers a
# reader of the card looks for first. A missing value is left out.
HEADLINE: dict[str, tuple[tuple[str, tuple, tuple | None], ...]] = {
    "online": (("win rate vs the initial policy", ("eval", "winrate_vs_init"), ("eval", "winrate_vs_init_ci95")),
               ("loss (first step)", ("loss_first",), None), ("loss (last step)", ("loss_last",), None),
               ("pairs trained on", ("trained_pairs",), None)),
    "sft": (("loss (first step)", ("loss_first",), None), ("loss (last step)", ("loss_last",), None),
            ("loss (mean of the last 5 steps)", ("loss_last_mean",), None), ("examples", ("examples",), None)),
    "rm": (("held-out accuracy", ("eval", "accuracy"), ("eval", "accuracy_ci95")),
           ("held-out accuracy before training", ("eval_before", "accuracy"), ("eval_before", "accuracy_ci95")),
           ("held-out ECE", ("eval", "ece"), None), ("held-out loss", ("eval", "loss"), None),
           ("training pairs", ("train_pairs",), None), ("held-out pairs", ("eval_pairs",), None)),
    "rl": (("held-out reward before", ("eval_before", "reward"), None),
           ("held-out reward after", ("eval_after", "reward"), None),
           ("training reward (last 5 steps)", ("last5", "objective/scores"), None),
           ("KL to the reference (last 5 steps)", ("last5", "objective/kl"), None)),
    "self-reward": (("win rate of M_T vs M_T-1", ("iterations", -1, "head_to_head_vs_prev", "win_rate_adjusted"),
                     ("iterations", -1, "head_to_head_vs_prev", "win_rate_adjusted_ci95")),
                    ("mean judge score of M_T", ("iterations", -1, "eval_mean_score"), None),
                    ("mean response length of M_T (chars)", ("iterations", -1, "mean_length_chars"), None)),
}

_BOOKKEEPING = {"command", "run_dir", "final_model", "steps", "steps_run", "resumed_from", "seconds", "processes"}


def _at(d: Any, path: Iterable) -> Any:
    for k in path:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):  # -1: the last iteration
            d = d[k]
        else:
            return None
    return d


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return str(v) if isinstance(v, int) else f"{v:.4g}"


def headline(command: str, summary: dict[str, Any]) -> list[tuple[str, Any, list | None]]:
    """(label, value, [low, high] or None) of the card's metrics: the command's :data:`HEADLINE`
    entries present in ``summary``; for another command its top-level numbers."""
    rows = []
    if command in HEADLINE:
        for label, path, ci in HEADLINE[command]:
            v = _at(summary, path)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                iv = _at(summary, ci) if ci else None
                ok = isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, (int, float)) for x in iv)
                rows.append((label, v, iv if ok else None))
        return rows
    return [(k, v, None) for k, v in summary.items()
            if k not in _BOOKKEEPING and isinstance(v, (int, float)) and not isinstance(v, bool)]


def _base_model(name: str | None) -> str | None:
    """The Hub id the front matter's ``base_model`` may name (local folders and unknown names: none)."""
    if not name:
        return None
    if name in EMBEDDED_ORIGINS:
        return EMBEDDED_ORIGINS[name]
    local = name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name))
    return None if local or not _REPO_ID.match(name) else name


def _cell(text: Any, limit: int = 200) -> str:
    """One Markdown table cell: one line, at most ``limit`` characters, pipes and backticks escaped."""
    one = " ".join(str(text).split())
    one = one if len(one) <= limit else one[:limit - 1] + "…"
    return one.replace("|", "\\|").replace("`", "'")


def model_card(*, command: str, config: dict[str, Any], manifest: dict[str, Any], summary: dict[str, Any],
               audit: dict[str, Any] | None = None) -> str:
    """The text of ``final/README.md``: YAML front matter for the Hub, then what the model is, the
    command and data it came from, the judge and its audit, the headline metrics (95% intervals
    where the summary has them), the pofe version and the config's sha256.

    ``config``: the resolved config as JSON (``config.yaml``); ``manifest``: ``run.json``;
    ``audit``: the ``--require-audit`` verdict this run was gated on (None: not gated)."""
    import yaml

    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    name = model.get("name")
    base = _base_model(name)
    tags = ["pofe", command]
    if command == "rm":
        tags.append("reward-model")
    front: dict[str, Any] = {"library_name": "transformers", "tags": tags,
                             "pipeline_tag": "text-classification" if command == "rm" else "text-generation"}
    if base:
        front["base_model"] = base
    lines = ["---", yaml.safe_dump(front, sort_keys=True, allow_unicode=True).rstrip("\n"), "---", "",
             f"# {_cell(Path(str(summary.get('run_dir') or 'model')).name)}", "",
             f"Trained with pofe (`pofe {command}`): preference optimisation from AI feedback.", "",
             "## Base model", ""]
    if name:
        origin = f" (the embedded GGUF of `{EMBEDDED_ORIGINS[name]}`)" if name in EMBEDDED_ORIGINS else ""
        lines.append(f"`{_cell(name)}`{origin}" + (f", revision `{_cell(model['revision'])}`" if model.get("revision") else ""))
        if model.get("adapter"):
            lines.append(f"with the LoRA adapter `{_cell(model['adapter'])}`")
    else:
        lines.append("(none recorded)")
    lines += ["", "## Command", "", "```", f"pofe {command} --config config.yaml", "```", "",
              f"with the run folder's `config.yaml` (sha256 `{manifest.get('config_sha256', '?')}`).", "", "## Data", ""]
    inputs = [i for i in manifest.get("inputs") or [] if isinstance(i, dict)]
    if inputs:
        lines += ["| key | file | sha256 |", "|---|---|---|"]
        lines += [f"| `{_cell(i.get('key'))}` | `{_cell(i.get('path'))}` | `{str(i.get('sha256', ''))[:16]}` |" for i in inputs]
    else:
        lines.append("No input files recorded in `run.json`.")
    lines += ["", "## Judge", ""]
    judge = _judge_of(config)
    if judge:
        lines.append(", ".join(f"{k} `{_cell(v)}`" for k, v in judge.items() if v not in (None, "", [])))
    else:
        lines.append("No judge in this command's config.")
    lines.append("")
    if audit:
        verdict = "passed" if audit.get("passed") else "FAILED"
        lines.append(f"Audit: **{verdict}** (`--require-audit {_cell(audit.get('report'))}`, judge "
                     f"`{_cell(audit.get('judge'))}`, calibration set sha256 `{str(audit.get('calibration_sha256'))[:16]}`).")
    else:
        lines.append("Audit: not gated (the run was started without `--require-audit`).")
    lines += ["", "## Metrics", ""]
    rows = headline(command, summary)
    if rows:
        lines += ["| metric | value | 95% interval |", "|---|---|---|"]
        lines += [f"| {_cell(label)} | {_num(v)} | {'[' + _num(iv[0]) + ', ' + _num(iv[1]) + ']' if iv else ''} |"
                  for label, v, iv in rows]
    else:
        lines.append("No headline metrics in `summary.json`.")
    lines += ["", f"Steps: {summary.get('steps')}. The whole summary is the run folder's `summary.json`.", "",
              "## Reproduce", "",
              f"- pofe version: `{manifest.get('pofe_version', '?')}`",
              f"- config sha256: `{manifest.get('config_sha256', '?')}` (the run folder's `config.yaml`)", ""]
    return "\n".join(lines)


def _judge_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """Kind, model and template of the config's judge (``judge:``, or ``reward.judge:``)."""
    j = config.get("judge")
    if not isinstance(j, dict):
        j = (config.get("reward") or {}).get("judge") if isinstance(config.get("reward"), dict) else None
    if not isinstance(j, dict) or not j.get("kind"):
        return None
    return {"kind": j.get("kind"), "model": j.get("model"), "template": j.get("template"),
            "constitution": j.get("constitution")}
