"""Every error pofe reports is a :class:`pofe.errors.PofeError` carrying its exit status
(2 bad input, 1 environment / run failure), so the CLI's one handler needs no table of class
names and no command converts exceptions itself."""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import socket
from pathlib import Path

from typer.testing import CliRunner

from pofe.cli.main import app, describe_error
from pofe.errors import PofeError

PKG = Path(__file__).resolve().parents[2] / "pofe"

# Exceptions defined in pofe that never reach the CLI, each with the reason.
INTERNAL = {
    # one failed attempt inside EndpointBackend's retry loop; after the last attempt it
    # becomes an EndpointError
    ("pofe.judges.backends.endpoint", "_ReplyError"),
    # the annotate HTTP handler answers these as a 400 / 409 / refused request to the page;
    # they end a request, never the server
    ("pofe.annotate.server", "BadRequest"),
    ("pofe.annotate.server", "Conflict"),
    ("pofe.annotate.server", "Refused"),
    # raised by the trace function inside a chat template's render; render_chat_template turns
    # it into one ModelError line naming the template's file
    ("pofe.models", "_TemplateTimeout"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pofe_exception_classes() -> list[tuple[str, str]]:
    """(module, class name) of every top-level class in pofe that derives from an exception:
    a base that is a builtin exception, is named ``*Error`` / ``*Exception``, or is such a
    class of pofe itself (followed to a fixed point: ``LogInUse(DataError)``). Read with
    ``ast``; the caller imports each one and checks it really is an exception."""
    known = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)}
    defs = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                defs.append((_module(path), node.name, bases))
    found: set[tuple[str, str]] = set()
    grew = True
    while grew:
        grew = False
        for mod, name, bases in defs:
            if (mod, name) not in found and any(b in known or b.endswith(("Error", "Exception")) for b in bases):
                found.add((mod, name))
                known.add(name)
                grew = True
    return sorted(found)


def test_every_reported_exception_is_a_pofe_error_with_its_own_exit_code():
    found = pofe_exception_classes()
    # the scan sees the classes the CLI used to look up by name (it cannot pass by finding nothing)
    names = {n for _, n in found}
    assert {"ConfigError", "DataError", "RunError", "ModelError", "CheckpointError", "MultiProcessRefused", "AuditError",
            "JudgeConfigError", "JudgeCapabilityError", "EndpointError", "JudgeError", "NonFiniteLoss", "NonFiniteWeights",
            "DeviceUnavailable", "EngineSyncError", "LogInUse", "LogWriteError"} <= names
    assert INTERNAL <= set(found), "an allow-listed class no longer exists: remove it from INTERNAL"
    wrong = []
    for mod, name in found:
        cls = getattr(importlib.import_module(mod), name)
        assert isinstance(cls, type) and issubclass(cls, BaseException), (mod, name)
        if (mod, name) in INTERNAL:
            assert not issubclass(cls, PofeError), f"{mod}.{name} is a PofeError: drop it from INTERNAL"
            continue
        if cls is PofeError:
            continue
        # the status is chosen below PofeError (its default is no decision)
        owner = next((k for k in cls.__mro__ if "exit_code" in vars(k)), None)
        if not issubclass(cls, PofeError) or owner in (None, PofeError) or cls.exit_code not in (1, 2):
            wrong.append(f"{mod}.{name}")
    assert wrong == []


class _Custom(PofeError):
    exit_code = 2


def _cases():
    from pofe.annotate.log import LogInUse, LogWriteError
    from pofe.annotate.server import ServeError
    from pofe.config import ConfigError, YAMLInputError
    from pofe.errors import DataError
    from pofe.evaluation.audit import AuditError
    from pofe.evaluation.report import RunFolderNotFound
    from pofe.generation.vllm import EngineSyncError
    from pofe.judges.base import EndpointError, JudgeCapabilityError, JudgeConfigError, JudgeError
    from pofe.runtime.guards import MultiProcessRefused, NonFiniteWeights

    return [
        (ConfigError("config.yaml: unknown key 'judge.tempalte'\n  did you mean judge.template?"), 2,
         "config.yaml: unknown key 'judge.tempalte'"),
        (YAMLInputError("config.yaml:3: duplicated key 'model'"), 2, "config.yaml:3: duplicated key 'model'"),
        (DataError("p.jsonl:4: missing field 'prompt'"), 2, "p.jsonl:4: missing field 'prompt'"),
        (LogInUse("cal.jsonl: annotator 'ann' is already labelling this log"), 2,
         "cal.jsonl: annotator 'ann' is already labelling this log"),
        (JudgeConfigError("template lacks {response_b}"), 2, "template lacks {response_b}"),
        (JudgeCapabilityError("judge length is pairwise only"), 2, "judge length is pairwise only"),
        (AuditError("audit failed: agreement 0.41 < 0.6", failed=["agreement"]), 2, "audit failed: agreement 0.41 < 0.6"),
        (MultiProcessRefused("pofe sft does not run data-parallel"), 2, "pofe sft does not run data-parallel"),
        (ServeError("cannot serve on 127.0.0.1:8000 (Address already in use)"), 2,
         "cannot serve on 127.0.0.1:8000 (Address already in use)"),
        (RunFolderNotFound("run folder not found: runs/x"), 2, "run folder not found: runs/x"),
        (EndpointError("http://127.0.0.1:9/v1: connection refused"), 1, "http://127.0.0.1:9/v1: connection refused"),
        (JudgeError("judge callable:m:f raised KeyError: 'x'"), 1, "judge callable:m:f raised KeyError: 'x'"),
        (NonFiniteWeights("step 3: lora_A is not finite"), 1, "step 3: lora_A is not finite"),
        (EngineSyncError("vLLM weight sync failed"), 1, "vLLM weight sync failed"),
        # its own one-line message naming the log, not only the errno's words
        (LogWriteError(errno.ENOSPC, "/r/cal.jsonl: could not write the event: No space left on device"), 1,
         "/r/cal.jsonl: could not write the event: No space left on device"),
        (_Custom("a subclass no table has heard of"), 2, "a subclass no table has heard of"),
    ]


def test_describe_error_takes_the_status_from_the_class():
    for exc, code, line in _cases():
        assert describe_error(exc) == (code, line), type(exc).__name__


def test_pofe_errors_keep_their_other_bases():
    from pofe.annotate.log import LogWriteError
    from pofe.annotate.server import ServeError
    from pofe.evaluation.audit import AuditError
    from pofe.evaluation.report import RunFolderNotFound
    from pofe.judges.base import EndpointError, JudgeConfigError, JudgeError

    assert issubclass(JudgeConfigError, JudgeError) and issubclass(JudgeConfigError, ValueError)
    assert issubclass(EndpointError, JudgeError) and issubclass(EndpointError, RuntimeError)
    assert issubclass(AuditError, RuntimeError) and AuditError("a", failed=["x"]).failed == ["x"]
    assert issubclass(RunFolderNotFound, FileNotFoundError) and issubclass(ServeError, OSError)
    e = LogWriteError(errno.ENOSPC, "/r/cal.jsonl: could not write")
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and str(e) == "/r/cal.jsonl: could not write"


def test_cli_main_has_no_table_of_class_names():
    tree = ast.parse((PKG / "cli" / "main.py").read_text(encoding="utf-8"))
    assigned = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    assert "_POFE_ERRORS" not in assigned
    names = {n for _, n in pofe_exception_classes()}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert strings & names == set()


def test_no_command_turns_an_exception_into_fail_itself():
    """``except X as e: fail(str(e))`` in a command only repeats what the handler in
    pofe.cli.main does (common.py's config resolution is not a command)."""
    found = []
    for path in sorted((PKG / "cli").glob("*.py")):
        if path.name in ("main.py", "common.py"):
            continue
        for h in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(h, ast.ExceptHandler) and h.name and len(h.body) == 1 and isinstance(h.body[0], ast.Expr)):
                continue
            call = h.body[0].value
            if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "fail" and len(call.args) == 1
                    and ast.dump(call.args[0]) == ast.dump(ast.parse(f"str({h.name})", mode="eval").body)):
                found.append(f"{path.name}:{h.lineno}")
    assert found == []


def test_annotate_on_a_port_in_use_is_one_line_exit_2(tmp_path):
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "Q?", "response_a": "A.", "response_b": "B, longer."}\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = CliRunner().invoke(app, ["annotate", str(tmp_path / "pairs.jsonl"), "-a", "ann", "-o", str(tmp_path / "cal.jsonl"),
                                     "--port", str(port)])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: cannot serve on 127.0.0.1:{port} (") and r.output.count("\n") == 1, r.output


def test_offline_mode_without_preferences_is_one_line_exit_2(tmp_path):
    r = CliRunner().invoke(app, ["online", "--mode", "offline", "--set", f"run.output_dir={tmp_path}",
                                 "--set", "log.progress=false"])
    assert r.exit_code == 2, r.output
    assert r.output == "error: mode=offline needs data.preferences (a prompt/chosen/rejected file)\n"
    assert list(tmp_path.iterdir()) == []  # bad input leaves no run folder


def test_report_of_a_missing_folder_is_exit_2(tmp_path):
    r = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and r.output == f"error: run folder not found: {tmp_path}/nope\n", r.output
