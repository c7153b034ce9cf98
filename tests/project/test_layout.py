"""The package's layering, checked on the source (nothing is imported): no import cycle between
pofe's modules, and no library module importing the CLI.

The graph counts every import in a file -- at the top, inside functions, under ``if`` -- because
an import inside a function is still a dependency: it only moves the failure (a half-initialised
module, an ``ImportError`` on first use) from import time to run time. Importing ``a.b.c`` also
executes the ``__init__`` of ``a`` and ``a.b``, so a package's ``__init__`` is a node of its own
and an import reaches it too, except from inside that package (whose ``__init__`` has already
run by then). ``importlib.import_module("pofe....")`` with a literal name counts as an import.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "pofe"

# The CLI's entry point (``python -m pofe``) is the one module outside pofe.cli meant to import it.
CLI_ENTRY_POINTS = {"pofe.__main__"}


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every ``.py`` under the package folder ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]):
    """(imported name, line) for every import in the file, relative imports resolved; ``from
    pkg import x`` names ``pkg.x`` when that is a module, else ``pkg``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in modules else base), node.lineno
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.args[0].value, node.lineno


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], str], dict[str, set[str]]]:
    """(module -> modules its import executes, (a, b) -> "file:line" of the first such import,
    module -> modules it names directly) over the package folder ``root``."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    where: dict[tuple[str, str], str] = {}
    direct: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        own = {name, *_ancestors(name)}
        for target, line in _targets(name, path, ast.parse(path.read_text(encoding="utf-8")), modules):
            while target and target not in modules:  # `from pofe.x import SomeClass`, `import pofe.x.y` of a
                target = target.rpartition(".")[0]  # name that is not a module: the module holding it
            if not target or target == name:
                continue
            direct[name].add(target)
            for dep in (*_ancestors(target), target):
                if dep in modules and dep not in own:
                    graph[name].add(dep)
                    where.setdefault((name, dep), f"{path.relative_to(root.parent)}:{line}")
    return graph, where, direct


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, larger than one only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside it)."""
    inside = set(component)
    start = component[0]
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & inside):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is not a cycle")


def cli_importers(direct: dict[str, set[str]], package: str = "pofe") -> dict[str, list[str]]:
    cli = f"{package}.cli"
    return {m: sorted(t for t in ts if t == cli or t.startswith(cli + "."))
            for m, ts in sorted(direct.items())
            if not (m == cli or m.startswith(cli + ".")) and m not in {f"{package}.__main__"}
            and any(t == cli or t.startswith(cli + ".") for t in ts)}


def test_no_import_cycles():
    graph, where, _ = import_graph(ROOT)
    # the walk found the package, and an import of pofe.generation.base reaches its package's __init__
    assert len(graph) > 100 and {"pofe.generation", "pofe.generation.base"} <= graph["pofe.judges.config"]
    problems = []
    for comp in strongly_connected(graph):
        cycle = one_cycle(graph, comp)
        steps = " -> ".join(f"{a} ({where[a, b]})" for a, b in pairwise(cycle))
        problems.append(f"{len(comp)} modules import each other: {', '.join(comp)}\n    e.g. {steps} -> {cycle[0]}")
    assert not problems, "import cycles in pofe/ (move the shared code down a layer):\n" + "\n".join(problems)


def test_no_library_module_imports_the_cli():
    _, where, direct = import_graph(ROOT)
    bad = cli_importers(direct)
    assert CLI_ENTRY_POINTS <= set(direct) and "pofe.cli.main" in direct["pofe.__main__"]
    assert not bad, "library modules import pofe.cli (raise DataError/ConfigError/... instead; the CLI prints " \
        "it): " + "; ".join(f"{m} -> {t} ({where[m, t]})" for m, ts in bad.items() for t in ts)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_checker_sees_function_imports_package_inits_and_cli_imports(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        # a cycle through a function-level relative import and a `from package import module`
        "pkg/a/__init__.py": "from pkg.a.x import X\n",
        "pkg/a/x.py": "X = 1\n\ndef f():\n    from ..b import y\n    return y\n",
        "pkg/b/__init__.py": "",
        "pkg/b/y.py": "from pkg.a import x\n",
        # a cycle only through a package __init__: d.z imports c.w, which runs c/__init__
        "pkg/c/__init__.py": "from pkg.d.z import Z\n",
        "pkg/c/w.py": "W = 1\n",
        "pkg/d/__init__.py": "",
        "pkg/d/z.py": "import pkg.c.w\nZ = 1\n",
        # siblings under an __init__ that imports them: not a cycle (the __init__ already ran)
        "pkg/e/__init__.py": "from pkg.e.m import M\n",
        "pkg/e/m.py": "from pkg.e.n import N\nM = N\n",
        "pkg/e/n.py": "N = 1\n",
        # the CLI: imported by the entry point (allowed) and by a library module (not)
        "pkg/cli/__init__.py": "",
        "pkg/cli/main.py": "import pkg.a\n\ndef main():\n    pass\n",
        "pkg/__main__.py": "from pkg.cli.main import main\n",
        "pkg/lib.py": "import importlib\n\ndef g():\n    return importlib.import_module('pkg.cli.main')\n",
    })
    graph, where, direct = import_graph(pkg)
    assert graph["pkg.a.x"] == {"pkg.b", "pkg.b.y"}
    assert graph["pkg.b.y"] == {"pkg.a", "pkg.a.x"}
    assert graph["pkg.a"] == {"pkg.a.x"}
    assert graph["pkg.d.z"] == {"pkg.c", "pkg.c.w"}
    assert graph["pkg.e.m"] == {"pkg.e.n"}
    assert where["pkg.a.x", "pkg.b.y"] == "pkg/a/x.py:4"
    assert strongly_connected(graph) == [["pkg.a", "pkg.a.x", "pkg.b.y"], ["pkg.c", "pkg.d.z"]]
    assert one_cycle(graph, ["pkg.c", "pkg.d.z"]) == ["pkg.c", "pkg.d.z", "pkg.c"]
    assert cli_importers(direct, "pkg") == {"pkg.lib": ["pkg.cli.main"]}


# ----------------------------------------------------------------------------- the loops are recipes

LOOPS = ROOT / "loops"
MAX_LOOP_LINES = 300
MAX_FUNCTION_LINES = 80
# The training commands and their loop modules: each runs on the one driver (pofe.recipe.drive).
DRIVEN = {"online": "online", "sft": "sft", "rm": "rm", "rl": "rl", "self-reward": "self_reward", "label": "label",
          "cai revise": "cai_revise"}
# Run-folder, resume, checkpoint and tracking code is the driver's alone.
DRIVER_ONLY = {"open_run", "write_config", "save_checkpoint", "load_checkpoint", "latest_checkpoint",
               "prune_checkpoints", "save_final", "final_complete", "MetricsSink", "Progress", "truncate_metrics",
               "resume_files", "rewind_metrics", "rewind", "rewind_output", "checkpoint_if_due",
               "resume_from_checkpoint", "link_final"}


def _loop_modules(root: Path) -> list[tuple[Path, str]]:
    """(file, name) of each command's module under ``root``: ``<cmd>.py``, or ``<cmd>/__init__.py`` for a
    command with pieces of its own beside it (those pieces are the algorithm, not the recipe, and are
    not held to the recipe's shape)."""
    found = [(p, p.name) for p in root.glob("*.py")] + [(p, f"{p.parent.name}/__init__.py") for p in root.glob("*/__init__.py")]
    return sorted(found, key=lambda f: f[1])


def loop_shape(root: Path) -> dict[str, list[str]]:
    """Problems per loop module under ``root``: too many lines, a function too long, a name only the
    driver may use (called, imported or read as an attribute), or (for a driven command) no Recipe
    subclass and no call of ``drive``."""
    out: dict[str, list[str]] = {}
    for path, name in _loop_modules(root):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        bad = []
        if len(text.splitlines()) > MAX_LOOP_LINES:
            bad.append(f"{len(text.splitlines())} lines (max {MAX_LOOP_LINES})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{node.name}() is {n} lines (max {MAX_FUNCTION_LINES})")
            names = ()
            if isinstance(node, ast.Name):
                names = (node.id,)
            elif isinstance(node, ast.Attribute):
                names = (node.attr,)
            elif isinstance(node, ast.ImportFrom):
                names = tuple(a.name for a in node.names)
            for n in names:
                if n in DRIVER_ONLY:
                    bad.append(f"uses {n} (line {node.lineno}): the driver's job")
        docs = {id(b[0].value) for b in [[tree.body[0]] if tree.body else []]
                + [n.body[:1] for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
                if b and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant)}
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "summary.json" in n.value
               and id(n) not in docs for n in ast.walk(tree)):
            bad.append("writes summary.json (the driver's job)")
        if name.split("/")[0].removesuffix(".py") in DRIVEN.values():
            recipes = [c for c in tree.body if isinstance(c, ast.ClassDef)
                       and any(getattr(b, "id", getattr(b, "attr", None)) == "Recipe" for b in c.bases)]
            drives = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "drive"]
            if not recipes:
                bad.append("defines no Recipe subclass")
            if not drives:
                bad.append("never calls drive()")
        if bad:
            out[name] = sorted(set(bad))
    return out


def test_every_training_command_is_a_recipe_on_the_one_driver():
    assert set(DRIVEN.values()) <= {name.split("/")[0].removesuffix(".py") for _, name in _loop_modules(LOOPS)}
    problems = loop_shape(LOOPS)
    assert not problems, "pofe/loops/ modules that are not short recipes on pofe.recipe.drive:\n" + "\n".join(
        f"  {name}: {'; '.join(p)}" for name, p in problems.items())


def hidden_pieces(root: Path) -> list[str]:
    """``<cmd>/<piece>.py`` whose name the command's ``__init__`` also binds at its top level (an import,
    a def, a class, an assignment): ``import pofe.loops.<cmd>.<piece> as m`` then yields that object, not
    the module, and a monkeypatch on it misses."""
    out = []
    for init in sorted(root.glob("*/__init__.py")):
        bound = set()
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound |= {n.id for tg in targets for n in ast.walk(tg) if isinstance(n, ast.Name)}
        out += [f"{init.parent.name}/{p.name}" for p in sorted(init.parent.glob("*.py")) if p.stem in bound]
    return out


def test_no_command_piece_is_hidden_by_a_name_of_its_package():
    assert not hidden_pieces(LOOPS), f"rename these pieces (their package binds the same name): {hidden_pieces(LOOPS)}"


def test_the_hidden_piece_checker_finds_a_clash(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "__init__.py").write_text("from pofe.loops.rl.rl_step import rl_step\n")
    (tmp_path / "rl" / "rl_step.py").write_text("def rl_step(): pass\n")
    (tmp_path / "rl" / "step.py").write_text("")
    assert hidden_pieces(tmp_path) == ["rl/rl_step.py"]


def test_the_loop_shape_checker_finds_each_defect(tmp_path):
    long_fn = "def f():\n" + "    x = 1\n" * 85
    (tmp_path / "rl.py").write_text('"""Writes summary.json (a docstring may say so)."""\n'
                                    "from pofe.recipe import Recipe, drive\n\nclass R(Recipe):\n    pass\n\n"
                                    "def run():\n    return drive(R())\n")
    (tmp_path / "sft.py").write_text("from pofe.runtime import save_checkpoint\n\n" + long_fn
                                     + "\nopen('summary.json')\n" + "# pad\n" * 300)
    # A command with pieces is a package: its __init__ is held to the shape, a piece beside it is not.
    (tmp_path / "online").mkdir()
    (tmp_path / "online" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "online" / "piece.py").write_text("from pofe.runtime import save_final\n" + "# pad\n" * 300)
    got = loop_shape(tmp_path)
    assert "rl.py" not in got and "online/piece.py" not in got
    assert got["online/__init__.py"] == ["defines no Recipe subclass", "never calls drive()"]
    assert got["sft.py"] == sorted(["defines no Recipe subclass", "never calls drive()", "f() is 86 lines (max 80)",
                                    f"{len((tmp_path / 'sft.py').read_text().splitlines())} lines (max 300)",
                                    "uses save_checkpoint (line 1): the driver's job", "writes summary.json (the driver's job)"])


# ---- package layers: which top-level rooms of pofe/ may import which
#
# One rank per top-level room (a subpackage or a top-level module); a room may import rooms of its
# own rank or below, never above. The layers, bottom up: leaves (records, config, errors, runs, ...)
# -> the runtime (``runtime``: processes, data parallel, sharding, ZeRO, checkpoints, guards, the
# optimiser step, ...; it imports only leaves) -> data, generation, judges -> evaluation -> the
# driver (``recipe``) -> the commands (``loops``: each command's recipe with its own pieces beside
# it; ``annotate``) -> the CLI.
LAYERS: dict[str, int] = {
    **dict.fromkeys(["pofe", "errors", "paths", "secrets", "config", "records", "labels", "losses", "plugins",
                     "preload", "outputs", "runs", "constitutions", "logprobs", "models", "model_folders", "hub", "jsonl",
                     "chat_control", "stats"], 0),
    "runtime": 1,
    **dict.fromkeys(["data", "generation", "judges"], 2),
    "evaluation": 3,
    "recipe": 4,
    **dict.fromkeys(["loops", "annotate"], 5),
    **dict.fromkeys(["cli", "__main__", "config_docs", "api"], 6),
}

# Arrows allowed to run up a layer: none is left (the last five moved down: DataError to errors,
# the JSON Lines helpers to jsonl, chat-control breaking to chat_control, the calibration map's
# apply/load to labels). The test fails on a new upward arrow AND on an entry here that no longer
# exists, so this set only shrinks; CONTRIBUTING.md states the rule.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_arrows(direct: dict[str, set[str]], layers: dict[str, int]) -> dict[tuple[str, str], list[str]]:
    """(room, room it imports from a higher layer) -> the module imports that make the arrow; a room
    missing from ``layers`` is reported as (room, "?") so a new room must be placed."""
    out: dict[tuple[str, str], list[str]] = {}
    for a, targets in direct.items():
        for b in targets:
            ra, rb = _room(a), _room(b)
            if ra == rb:
                continue
            if ra not in layers or rb not in layers:
                out.setdefault((ra if ra not in layers else rb, "?"), []).append(f"{a} -> {b}")
            elif layers[rb] > layers[ra]:
                out.setdefault((ra, rb), []).append(f"{a} -> {b}")
    return out


def test_package_layers_only_point_down():
    _, _, direct = import_graph(ROOT)
    rooms = {_room(m) for m in direct}
    assert len(rooms) > 20 and not rooms - set(LAYERS), f"place these top-level rooms of pofe/ in LAYERS: {sorted(rooms - set(LAYERS))}"
    up = upward_arrows(direct, LAYERS)
    new = {k: v for k, v in up.items() if k not in KNOWN_UPWARD}
    assert not new, "imports running up a layer (move the shared code down): " + "; ".join(
        f"{a} -> {b}: {', '.join(sorted(v)[:3])}" for (a, b), v in sorted(new.items()))
    gone = KNOWN_UPWARD - set(up)
    assert not gone, f"these upward arrows are gone: delete them from KNOWN_UPWARD: {sorted(gone)}"


def test_the_layer_checker_finds_an_upward_arrow(tmp_path):
    root = _write(tmp_path, {"pkg/__init__.py": "", "pkg/runs.py": "from pkg.loops import x\n",
                             "pkg/loops/__init__.py": "x = 1\n", "pkg/newroom.py": "import pkg.runs\n"})
    _, _, direct = import_graph(root)
    up = upward_arrows(direct, {"pkg": 0, "runs": 0, "loops": 5})
    assert up == {("runs", "loops"): ["pkg.runs -> pkg.loops"], ("newroom", "?"): ["pkg.newroom -> pkg.runs"]}
