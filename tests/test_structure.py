"""The house rules that keep one model, one forward (docs/architecture.md rule 7) and an acyclic
import graph, checked on the source so they cannot quietly come back:

- runtime/, train/, bench/ and tools/ name no model internals (decoder-layer, attention or draft-fusion
  arithmetic, KV-cache writes): they call the public forwards and blocks of models/;
- no file uses a private `_name` that another file defines;
- no import cycle between modules of the project's packages, function-local imports included.
"""
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "prompt", "scenes", "models", "runtime", "train", "bench", "tools", "export", "calibration", "engines")
OUTSIDE_MODELS = ("runtime", "train", "bench", "tools")
# what only models/ may write: the pieces of a decoder layer, attention, the draft's fusion
# and the cache writes of the one cache contract
INTERNALS = {
    r"\bself_attn\b": "a decoder layer's attention module",
    r"\b(input|post_attention)_layernorm\b": "a decoder layer's norms",
    r"\.(q|k|v|o)_proj\(": "attention projections",
    r"\.mlp\(": "a decoder layer's MLP",
    r"\battend\(|scaled_dot_product_attention": "attention arithmetic",
    r"\bin_proj\(|\.fc\(": "the draft's input fusion",
    r"\bindex_copy_\(": "KV-cache writes",
    r"\blm_head\(": "the LM head (call the model's head())",
}
# private names of the standard library / numpy / torch that files may use
LIBRARY_PRIVATE = {"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe", "_version"}


def sources(packages):
    for pkg in packages:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            yield f, f.read_text()


def test_no_model_internals_outside_models():
    hits = []
    for f, text in sources(OUTSIDE_MODELS):
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in INTERNALS.items():
                if re.search(pattern, code):
                    hits.append(f"{f.relative_to(ROOT)}:{n}: {what}: {line.strip()}")
    assert not hits, "model internals outside models/ (call a public block of models/):\n" + "\n".join(hits)


def _defined(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in LIBRARY_PRIVATE


def test_no_private_name_of_another_file():
    hits = []
    for f, text in sources(PACKAGES):
        tree = ast.parse(text, str(f))
        mine = _defined(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                hits += [f"{f.relative_to(ROOT)}:{node.lineno}: imports {a.name} from {node.module}"
                         for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in mine:
                hits.append(f"{f.relative_to(ROOT)}:{node.lineno}: uses .{node.attr}, defined in another file")
    assert not hits, "private names used across files (make them public where they belong):\n" + "\n".join(hits)


def import_graph(packages=PACKAGES) -> dict[str, set]:
    """{module: project modules it imports}, every import statement (function-local too)."""
    files = {}
    for pkg in packages:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = f
    graph = {m: set() for m in files}
    for mod, f in files.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")
                    keep = len(parts) - node.level + (f.name == "__init__.py")
                    base = ".".join(parts[:keep] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod and not t.startswith(mod + "."):   # a package importing its children is fine
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_any_package():
    graph = import_graph()
    assert len(graph) > 50 and graph["train.sft"], "the import graph looks empty: is ROOT right?"
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# --- the house (issue 22): sizes, one backend seam, one declaration of the graphs ---------------
ONLY_IN_GRAPHS = ("vision_frame", "draft_prefill", "draft_feed", "draft_chain", "action_velocity", "action_output")


def test_planner_and_command_files_stay_small():
    sizes = {f.relative_to(ROOT).as_posix(): len(f.read_text().splitlines())
             for f in [ROOT / "runtime" / "planner.py", *sorted((ROOT / "tools").glob("*.py"))]}
    big = {f: n for f, n in sizes.items() if n > (250 if f == "runtime/planner.py" else 120)}
    assert not big, f"over the limit (planner.py 250 lines, a command file 120): {big}"


def test_backend_host_logic_is_written_once_in_the_base():
    """Write-then-expert (`action`), the mask rows and the readout switch live in runtime/backend.py;
    a backend module implements write / expert / its own read-back only."""
    hits = []
    for f, text in sources(["runtime"]):
        if f.name == "backend.py" and f.parent.name == "runtime":
            continue
        for pattern in (r"def action\(", r"readout == \"argmax\"", r"\bmask_rows\(", r"def allowed_rows\("):
            hits += [f"{f.relative_to(ROOT)}: {pattern}" for _ in re.finditer(pattern, text)]
    assert not hits, hits


def test_each_bench_room_is_named_after_its_command():
    """bench/NAME/ serves `specdrive NAME` (dashes as underscores); bench/common/ is what they share."""
    table = re.findall(r'^\s*"([a-z-]+)": "tools\.', (ROOT / "tools" / "cli.py").read_text(), re.M)   # the subcommands
    commands = {name.replace("-", "_") for name in table}
    rooms = {d.name for d in (ROOT / "bench").iterdir() if (d / "__init__.py").is_file()} - {"common"}
    assert rooms <= commands, f"rooms named after no command: {sorted(rooms - commands)}"


def test_mode_config_is_defined_once():
    """A mode name to planner overrides: bench/common/modes.py alone defines it."""
    hits = [str(f.relative_to(ROOT)) for f, text in sources(PACKAGES) if re.search(r"^def mode_config\(", text, re.M)]
    assert hits == ["bench/common/modes.py"], hits


CORE_NAMES = ("config", "artifacts", "stamp", "graphs")


def test_the_ground_floor_is_core_and_prompt_holds_the_prompt_contract_alone():
    """config, the artifact cards, the stamps and the graph names live in core/ (import-linter keeps
    core from importing any room); prompt/ has no module of those names and nothing imports one."""
    assert all((ROOT / "core" / f"{n}.py").is_file() for n in CORE_NAMES)
    assert not [n for n in CORE_NAMES if (ROOT / "prompt" / f"{n}.py").exists()]
    old = re.compile(rf"^\s*(from|import) prompt\.({'|'.join(CORE_NAMES)})\b", re.M)
    hits = [str(f.relative_to(ROOT)) for f, text in sources([*PACKAGES, "tests"]) if old.search(text)]
    assert not hits, hits


def test_graph_names_are_declared_once():
    """The graph names only core/graphs.py spells (the other graph names, "vision", "prefill" and
    "step", are also stage names and meta.json sections, so they are not checked here)."""
    hits = []
    for f, text in sources([p for p in PACKAGES if p != "core"]):
        for name in ONLY_IN_GRAPHS:
            hits += [f"{f.relative_to(ROOT)}: {name!r}" for _ in re.finditer(rf"[\"']{name}[\"']", text)]
    assert not hits, hits


def test_engine_precisions_cover_exactly_the_declared_graphs():
    import dataclasses

    from engines.profile import GraphPrecision
    from core.graphs import GRAPHS, SHAPES
    from runtime.config import CAMERAS

    assert tuple(f.name for f in dataclasses.fields(GraphPrecision)) == GRAPHS
    assert SHAPES.cameras == len(CAMERAS)


# --- tests import helpers, never each other; Python 3.10 is the floor (issue 34) -----------------
def imports_of_test_modules(source: str, name: str = "<source>") -> list[str]:
    """Imports of another tests/test_*.py module in SOURCE (bare `test_x` or `tests.test_x`)."""
    hits = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""                       # `from . import test_x`: base ""
            mods = [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[-1].startswith("test_") and parts[:-1] in ([], ["tests"]):
                hits.append(f"{name}:{node.lineno}: imports {mod}")
    return hits


def test_the_test_import_checker_finds_an_import():
    planted = ("import os\nfrom tests.test_a import x\nimport test_b\nfrom tests import test_c, folders\n"
               "from . import test_d\n")
    assert [h.rsplit(" ", 1)[1] for h in imports_of_test_modules(planted)] == [
        "tests.test_a", "test_b", "tests.test_c", "test_d"]
    assert not imports_of_test_modules("from tests.folders import copy_of\nfrom table_backend import prompts\n")


def test_no_test_module_imports_another():
    """Shared fixtures live in tests/conftest.py, shared helpers in non-test modules of tests/."""
    files = sorted((ROOT / "tests").glob("test_*.py"))
    hits = [h for f in files for h in imports_of_test_modules(f.read_text(), f.name)]
    assert len(files) > 50 and not hits, "a test module imports another (move the piece to " \
        "tests/conftest.py or a helper module):\n" + "\n".join(hits)


def _make_var(name: str) -> str:
    m = re.search(rf"^{name}\s*=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"Makefile has no {name} ="
    return m.group(1)


def py310_check(*paths, show: bool = False) -> subprocess.CompletedProcess:
    """The Makefile's Python 3.10 check (PY310, the vermin of this environment) on PATHS; `show`:
    the rerun that prints the violations."""
    tool, *flags = _make_var("PY310").split() + ["--violations"] * show
    return subprocess.run([str(Path(sys.executable).parent / tool), *flags, *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_py310_check_fails_on_3_11_code_and_passes_3_10_code(tmp_path):
    (tmp_path / "new.py").write_text("import datetime\nimport tomllib\nfrom typing import Self\n\n"
                                     "print(datetime.UTC, tomllib, Self)\n")
    # 3.11 syntax: reported as `except*` on 3.11+, a syntax error (--pessimistic: fails) on 3.10
    (tmp_path / "star.py").write_text("try:\n    pass\nexcept* ValueError:\n    pass\n")
    (tmp_path / "ok.py").write_text("from __future__ import annotations\nimport sys\n\n"
                                    "if sys.version_info >= (3, 11):\n    import tomllib\nelse:\n"
                                    "    import tomli as tomllib\n\n\ndef f(x: int | None) -> list[int]:\n"
                                    "    match x:\n        case None:\n            return []\n"
                                    "    return [x, len(tomllib.loads(''))]\n")
    for planted in ("new.py", "star.py"):
        assert py310_check(tmp_path / planted).returncode != 0, f"{planted} passed the 3.10 check"
    shown = py310_check(tmp_path / "new.py", tmp_path / "star.py", show=True).stdout
    for construct in ("'datetime.UTC' member", "'tomllib' module", "'typing.Self' member", "except*"):
        assert construct in shown, f"{construct} not reported:\n{shown}"
    ok = py310_check(tmp_path / "ok.py")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_the_py310_check_covers_every_python_file():
    """PY_TREE (what `make lint` / `make test` check) holds every .py file of the tree."""
    tree = _make_var("PY_TREE").replace("$(wildcard", " ").replace(")", " ").split()
    tops = [p for p in ROOT.iterdir() if not p.name.startswith(".") and p.name not in ("build", "out", "dist")]
    files = [f.relative_to(ROOT) for top in tops for f in ([top] if top.is_file() else top.rglob("*.py"))
             if f.suffix == ".py" and not any(part.startswith(".") for part in f.relative_to(ROOT).parts)]
    outside = [f.as_posix() for f in files if f.parts[0] not in tree]
    assert len(files) > 150 and not outside, f"Python files the 3.10 check does not see: {outside}"


# --- one way to configure a run (issue 34): libraries take typed configs, never a Namespace -------
LIBRARIES = ("core", "prompt", "scenes", "models", "runtime", "train", "export", "calibration", "engines", "bench")


def namespace_params(tree) -> list[tuple[int, str, str]]:
    """(line, function, parameter) of every parameter annotated `Namespace` / `argparse.Namespace`,
    and of every unannotated parameter named `args` used as a Namespace (an attribute read from it,
    or vars(args) / getattr(args, ...))."""
    hits = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        name = getattr(fn, "name", "<lambda>")
        for p in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            note = ast.unparse(p.annotation) if p.annotation is not None else ""
            if re.search(r"\bNamespace\b", note) or (p.arg == "args" and not note and _used_as_namespace(fn, p.arg)):
                hits.append((fn.lineno, name, p.arg))
    return hits


def _used_as_namespace(fn, arg: str) -> bool:
    def is_arg(node) -> bool:
        return isinstance(node, ast.Name) and node.id == arg
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and is_arg(node.value):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("vars", "getattr") \
                and node.args and is_arg(node.args[0]):
            return True
    return False


PLANTED = '''
import argparse
def run(args):
    return args.out
def typed(ns: argparse.Namespace): ...
def quoted(ns: "Namespace"): ...
def spread(*args):
    return args[0]
def a_tuple(args: tuple):
    return args.count(1)
def passed_on(args):
    return vars(args)
def keyword(*, args=None):
    return getattr(args, "out", None)
'''


def test_the_namespace_checker_finds_planted_namespaces():
    found = [(fn, p) for _, fn, p in namespace_params(ast.parse(PLANTED))]
    assert found == [("run", "args"), ("typed", "ns"), ("quoted", "ns"), ("passed_on", "args"), ("keyword", "args")]


def test_no_library_function_takes_an_argparse_namespace():
    """tools/ turns arguments into typed configs (frozen dataclasses); the libraries take those."""
    hits = [f"{f.relative_to(ROOT)}:{line}: {fn}({p})"
            for f, text in sources(LIBRARIES) for line, fn, p in namespace_params(ast.parse(text, str(f)))]
    assert not hits, "library functions taking an argparse Namespace (take a typed config):\n" + "\n".join(hits)


# --- a planner config is changed in one way: runtime.config.with_overrides -----------------------
def planner_sections() -> tuple[set, set]:
    """(PlannerConfig's field names, the names of its sections: the fields that are dataclasses)."""
    import dataclasses
    from runtime.config import PlannerConfig
    cfg = PlannerConfig()
    fields = {f.name for f in dataclasses.fields(cfg)}
    return fields, {name for name in fields if dataclasses.is_dataclass(getattr(cfg, name))}


def _is_replace(call) -> bool:
    """CALL is `replace(...)` or `dataclasses.replace(...)`."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr == "replace" and isinstance(f.value, ast.Name) and f.value.id == "dataclasses"
    return isinstance(f, ast.Name) and f.id == "replace"


def _through_section(node, sections: set) -> bool:
    """NODE is `x.<section>` or a field of one, `x.<section>.<field>`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr in sections:
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr in sections


def _assigned_in_config(node, sections: set) -> bool:
    """NODE, an assignment target, is a field of a section (`x.spec.k`) or a section of an owner
    named as a config (`cfg.budget`, `planner.cfg.reuse`; a result's `res.checks` is not one)."""
    if not _through_section(node, sections):
        return False
    if node.attr not in sections:
        return True
    owner = node.value
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return bool(re.search(r"(cfg|config)$", name))


def planner_config_edits(tree) -> list[tuple[int, str]]:
    """(line, code) of every change to a planner config made around with_overrides, found by name
    (the code has no types to read): a dataclasses.replace with a keyword that is a PlannerConfig
    field, or of `x.<section>` (spec, budget, checks, reuse); an assignment to a field of a section,
    or to a section of something named `...cfg` / `...config`. A top-level field that other objects
    share (max_len) is caught in replace only."""
    fields, sections = planner_sections()
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_replace(node):
            if {k.arg for k in node.keywords} & fields or (node.args and _through_section(node.args[0], sections)):
                hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hits += [(node.lineno, ast.unparse(node)) for t in targets if _assigned_in_config(t, sections)]
    return sorted(hits)


PLANTED_EDITS = '''
import dataclasses
from dataclasses import replace
a = dataclasses.replace(cfg, fallback="inline")
b = replace(cfg.spec, k=8)
c = dataclasses.replace(cfg, budget=BudgetConfig())
cfg.spec.k = 8
planner.cfg.budget = BudgetConfig()
cfg.reuse.max_frames += 1
ok = dataclasses.replace(model_cfg, draft=d)
res.checks = checked
ok = dataclasses.replace(w, k=3, tau=1.0)
self.max_len = 64
'''


def test_the_planner_config_edit_checker_finds_planted_edits():
    assert [line for line, _ in planner_config_edits(ast.parse(PLANTED_EDITS))] == [4, 5, 6, 7, 8, 9]


def test_planner_configs_change_only_through_with_overrides():
    """with_overrides re-builds and re-validates the whole config and names where a bad key came
    from; a dataclasses.replace of a section skips PlannerConfig's checks across sections
    (spec.relax_r against trajectory, reuse.max_frames against the cameras), an assignment every check."""
    hits = [f"{f.relative_to(ROOT)}:{line}: {code}" for f, text in sources(LIBRARIES + ("tools",))
            for line, code in planner_config_edits(ast.parse(text, str(f)))]
    assert not hits, "planner configs changed around runtime.config.with_overrides:\n" + "\n".join(hits)


# --- runtime files a reader can hold; the TensorRT backend's buffers are typed -------------------
RUNTIME_MAX_LINES = 450
TENSORRT = ROOT / "runtime" / "backends" / "tensorrt"


def test_no_runtime_file_is_over_450_lines():
    big = {f.relative_to(ROOT).as_posix(): n for f, text in sources(["runtime"])
           if (n := len(text.splitlines())) > RUNTIME_MAX_LINES}
    assert not big, f"runtime/ files over {RUNTIME_MAX_LINES} lines (split them by what they hold): {big}"


def string_subscripts(source: str, name: str = "<source>") -> list[str]:
    """Every `x["literal"]` in SOURCE, loads and stores: a buffer addressed by a string."""
    return [f"{name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source, name))
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)]


def byte_literals(source: str, name: str = "<source>") -> list[str]:
    """Every multiplication by 4 or 8 in SOURCE: an fp32 / int64 element size written as a number."""
    hits = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in (4, 8) and type(side.value) is int:
                    hits.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_the_buffer_checkers_find_planted_subscripts_and_sizes():
    planted = ('cuda.h2d(e.buf["ids"], host, s)\nself.kv["cache"] = 1\nx = e.dtype[name]\n'
               'y = self.feats + (start + 1) * F * 4\nz = slot + 8 * j\nw = 2 * (k + 1)\n')
    assert {h.split(": ", 1)[1] for h in string_subscripts(planted)} == {"e.buf['ids']", "self.kv['cache']"}
    assert len(byte_literals(planted)) == 2                  # `2 * (k + 1)` is a count, not a size
    assert not string_subscripts("e.io.ids.ptr\nx[n]\n") and not byte_literals("a.bytes(n * F)\n")


def test_the_tensorrt_backend_addresses_buffers_by_attribute_and_sizes_by_dtype():
    """Device buffers are typed sets (runtime/backends/tensorrt/buffers.py): `e.io.logits`, not
    `e.buf["logits"]`; element sizes come from the buffers' dtypes, never a literal 4 or 8."""
    files = sorted(TENSORRT.glob("*.py"))
    hits = [h for f in files for h in string_subscripts(f.read_text(), f.relative_to(ROOT).as_posix())]
    hits += [h for f in files for h in byte_literals(f.read_text(), f.relative_to(ROOT).as_posix())]
    assert len(files) >= 6 and not hits, "string-subscripted buffers or literal element sizes:\n" + "\n".join(hits)


# the modules that declare a card schema and so may serialize it (scenes/dataset.py: a dataset's
# manifest.json, another schema than an engines build's)
SCHEMA_MODULES = ("core/artifacts.py", "scenes/dataset.py")
CARD_NAMES = re.compile(r"meta\.json|manifest\.json|\bMETA\b|\bMANIFEST\b")


def card_writes(tree: ast.AST, text: str) -> list[int]:
    """Lines that serialize JSON into a card file (meta.json, manifest.json): PATH.write_text(json.dumps(...))
    or json.dump(..., open(PATH)) where PATH names a card."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target, args = node.func.value, node.args
        if node.func.attr == "dump":
            target, args = (args[1] if len(args) > 1 else target), args[:1]
        elif node.func.attr != "write_text":
            continue
        dumps = any(isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in ("dumps", "dump")
                    for arg in args for a in ast.walk(arg))
        if (dumps or node.func.attr == "dump") and CARD_NAMES.search(ast.get_source_segment(text, target) or ""):
            lines.append(node.lineno)
    return lines


def test_the_card_write_checker_finds_planted_writes():
    planted = ('(out / "meta.json").write_text(json.dumps(meta, indent=2))\n'
               'json.dump(manifest, open(out / MANIFEST, "w"))\n'
               '(out / "report.json").write_text(json.dumps(report))\n')
    assert card_writes(ast.parse(planted), planted) == [1, 2]


def test_cards_are_serialized_only_by_their_schema_module():
    """A meta.json or manifest.json is written by its card (core/artifacts.py: `card.write(folder)`),
    never from a dict built beside the writer: each schema is declared once, where it is parsed."""
    hits = [f"{f.relative_to(ROOT)}:{line}" for f, text in sources(PACKAGES)
            if f.relative_to(ROOT).as_posix() not in SCHEMA_MODULES
            for line in card_writes(ast.parse(text, str(f)), text)]
    assert not hits, "meta.json / manifest.json written outside the schema module (build the card, " \
                     "call its write()):\n" + "\n".join(hits)


def test_the_tracked_tree_fits_a_device_run():
    """The GPU machine runs a copy of the checkout's tracked files, 64 MiB at most (the committed
    checkpoints, twin and grid cells included): a tree that outgrows it can no longer be measured
    there. Leave 8 MiB for the untracked scripts a device check carries."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / p for p in files.decode().split("\0") if p]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    biggest = sorted(((p.stat().st_size, str(p.relative_to(ROOT).parts[0])) for p in paths if p.is_file()),
                     reverse=True)[:3]
    assert total < 56 * 2 ** 20, f"tracked files take {total / 2 ** 20:.1f} MiB (limit 56); largest: {biggest}"
