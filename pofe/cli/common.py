"""Shared CLI plumbing: config resolution with exit status 2 on bad input, --print-config,
--json output. Each command lives in ``pofe/cli/<command>.py`` and exposes ``register(app)``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from pofe.config import ConfigError, PofeConfig, dump_config, load_config, parse_override

T = TypeVar("T", bound=PofeConfig)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override a key: --set judge.template=helpful-short (repeatable).")
PrintConfigOpt = typer.Option(False, "--print-config", help="Print the resolved config and exit.")
_json = {"out": None}  # where emit_json writes once --json took stdout for the JSON alone


def json_only_stdout(value: bool) -> bool:
    """``--json``'s callback (it runs before the command imports torch): from here on stdout
    carries the JSON alone. Everything else written to it -- a library's ``print``, a logging
    handler bound to ``sys.stdout`` when its module loads (DeepSpeed's "Setting accelerator to
    CPU", imported under accelerate), C code and child processes writing to fd 1 -- goes to
    stderr; :func:`emit_json` writes to the real stdout, so ``pofe ... --json | jq`` reads JSON."""
    _json["out"] = None
    if not value:
        return value
    sys.stdout.flush()
    out = sys.stdout
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # an in-process runner's buffer: no fd to move
        fd = None
    if fd is not None:
        out = os.fdopen(os.dup(fd), "w", encoding="utf-8")
        os.dup2(sys.stderr.fileno(), fd)
    _json["out"] = out
    sys.stdout = sys.stderr
    return value


PushToHubOpt = typer.Option(None, "--push-to-hub", metavar="REPO",
                            help="Upload final/ (with its model card README.md) to this Hugging Face repo when the "
                                 "run ends (run.push_to_hub; token from HF_TOKEN or `hf auth login`).")


def with_push(sets: Optional[list[str]], repo: Optional[str]) -> Optional[list[str]]:
    """``--push-to-hub REPO`` as ``--set run.push_to_hub=REPO`` (the text as typed), so that with
    ``--resume`` it confirms the run folder's own setting as any ``--set`` does."""
    if repo is None:
        return sets
    return [*(sets or []), f"run.push_to_hub={_yaml_quoted(repo)}"]


JsonOpt = typer.Option(False, "--json", callback=json_only_stdout,
                       help="Print a JSON summary on stdout at the end (and nothing else there).")
TrustRunConfigOpt = typer.Option(
    False, "--trust-run-config",
    help="With --resume: accept the settings in the run folder's config.yaml that run code or send data "
         "(callable judges, trust_remote_code, endpoint URLs). Without it they are refused unless repeated "
         "with --set KEY=VALUE.")


def fail(message: str, code: int = 2) -> None:
    """One-line error on stderr, then exit (status 2 for bad input). A bad-input error leaves
    no run folder behind: one this process created and computed nothing in is removed."""
    if code == 2:
        discard_unused_runs()
    from pofe.secrets import redact  # the message can quote a value that is a key

    typer.echo(f"error: {redact(message)}", err=True)
    raise typer.Exit(code)


def discard_unused_runs() -> None:
    """Remove fresh run folders this process left empty (only when ``pofe.runs`` is loaded:
    the import costs nothing then)."""
    runs = sys.modules.get("pofe.runs")
    if runs is not None:
        runs.discard_unused_runs()


def _keep_typed_name(sets: list[str]) -> list[str]:
    """``--set run.name=123`` / ``=2024-12-01`` / ``=$'a\\nb'``: the folder name is the text the
    user typed, not what YAML makes of it (an int, a date, a folded line); quote it so the
    validator sees exactly that text."""
    out = []
    for text in sets:
        key, eq, raw = text.partition("=")
        v = raw.strip()
        as_yaml = v in ("null", "Null", "NULL", "~") or (len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"")
        # null (the default name) and an explicitly quoted YAML string keep their YAML meaning
        out.append(f"run.name={_yaml_quoted(raw)}" if eq and key.strip() == "run.name" and not as_yaml else text)
    return out


# What YAML takes raw inside a double-quoted scalar: printable, and not a line break (NEL, LS, PS fold).
_YAML_RAW = re.compile("[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _yaml_quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that loads back to exactly ``text``: Unicode raw,
    escapes only for what YAML does not take raw. (``json.dumps``'s ASCII escapes wrote an emoji
    as a UTF-16 surrogate pair, which YAML decodes as two lone surrogates: ``run.name=naïve-💥``
    was an internal error.)"""
    body = json.dumps(text, ensure_ascii=False)[1:-1]  # quotes, backslashes and controls escaped
    return '"' + _YAML_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", body) + '"'


def _confirmations(resume: Path, sets: list[str]) -> dict[str, Any]:
    """With ``--resume``, ``--set KEY=VALUE`` may only repeat a code-running setting of the saved
    config (``--set judge.callable=mymod:score``), so that it comes from the command line."""
    out: dict[str, Any] = {}
    for text in sets:
        try:
            keypath, value = parse_override(text)
        except ConfigError as e:
            fail(str(e))
        out[".".join(keypath)] = (value, text)
    return out


def resumable_setting(key: str) -> bool:
    """A key ``--set`` may change on ``--resume`` (:data:`pofe.runs.RESUMABLE_SETTINGS`)."""
    from pofe.runs import RESUMABLE_SETTINGS

    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_SETTINGS)


def _check_trust(resume: Path, cfg: PofeConfig, confirmed: dict[str, Any], trust: bool) -> None:
    from pofe.runs import untrusted_settings

    found = dict(untrusted_settings(cfg))
    for key, (value, text) in confirmed.items():
        if key not in found:
            fail(f"--resume {resume}: --set {text} is refused; a resumed run keeps its saved config.yaml "
                 f"(start a new run to change settings; with --resume, --set only confirms a code-running setting or "
                 f"changes judge.budget, run.collective_timeout_s or run.allow_world_change)")
        if value != found[key]:
            fail(f"--resume {resume}: --set {key}={value!r} differs from the run's {found[key]!r}; a resumed run "
                 f"keeps its saved config.yaml (start a new run to change it)")
    if trust:
        return
    for key, value in found.items():
        if key not in confirmed:
            shown = json.dumps(value) if isinstance(value, bool) else value
            fail(f"--resume {resume}: the run folder's config.yaml sets {key}: {shown}, which runs code or sends the "
                 f"run's data out; a run folder is not trusted: pass --trust-run-config, or give it on the command "
                 f"line: --set {key}={shown}")


def resolve_config(cls: type[T], config: Optional[Path], sets: Optional[list[str]], extra: dict[str, Any] | None = None,
                   print_config: bool = False, resume: Optional[Path] = None, trust_run_config: bool = False) -> T:
    """Load the command's config or exit 2 naming the bad key and the file.

    With ``resume`` (a run folder), the run's own saved ``config.yaml`` is the truth: a
    resumed run must continue the run that was started, never a default one (a resume that
    rebuilt the config from defaults once overwrote the run's config and mixed two judges'
    labels in one file). ``--config`` and options are refused with a resume; the folder must
    be unchanged since its ``run.json`` was written; and a setting in it that runs code or
    sends data out is refused unless ``trust_run_config`` or repeated as ``--set KEY=VALUE``
    (a run folder is data from anyone: its config once made a resume delete a directory).
    """
    runs = sys.modules.get("pofe.runs")
    if runs is not None:  # a new command: only folders it creates itself are ever discarded
        runs.forget_fresh_runs()
    confirmed: dict[str, Any] = {}
    if resume is not None:
        from pofe.runs import RunError, verify_run_folder

        saved = Path(resume) / "config.yaml"
        if not saved.is_file():
            fail(f"--resume {resume}: no config.yaml there (not a pofe run folder)")
        given = [k for k, v in (extra or {}).items() if v is not None]
        if config is not None or given:
            what = "--config" if config is not None else f"option {given[0]}"
            fail(f"--resume {resume}: {what} is refused; a resumed run keeps its saved config.yaml "
                 f"(start a new run to change settings)")
        try:
            verify_run_folder(resume)  # refuses a changed config or input, or a config.yaml link, before it is read
        except RunError as e:
            fail(str(e))
        confirmed = _confirmations(resume, sets or [])
        # a limit such as judge.budget changes what the run may spend, not what it computes: taken on resume
        sets = [text for key, (_, text) in confirmed.items() if resumable_setting(key)]
        confirmed = {k: v for k, v in confirmed.items() if not resumable_setting(k)}
        config, extra = saved, {}
    try:
        cfg = load_config(cls, config, _keep_typed_name(sets or []),
                          {k: v for k, v in (extra or {}).items() if v is not None})
    except ConfigError as e:
        fail(str(e))
    if resume is not None:  # printing the config runs nothing from the folder
        _check_trust(resume, cfg, confirmed, trust_run_config or print_config)
        if sets and not print_config:
            from pofe.runs import RunError, rewrite_resumed_config

            try:
                rewrite_resumed_config(resume, cfg)  # a later resume keeps the new limit
            except RunError as e:
                fail(str(e))
    if print_config:
        typer.echo(dump_config(cfg, comments=True), nl=False)
        raise typer.Exit(0)
    return cfg


def emit_json(obj: Any) -> None:
    out = _json["out"] or sys.stdout
    out.write(json.dumps(obj, indent=2, default=str) + "\n")
    out.flush()
