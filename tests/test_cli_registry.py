"""`attnflow.registry.SWEEPING` (which experiments run `attnflow.sweep`, known before running
them) against the source: a call graph of attnflow's functions, read from their code."""

import ast
from pathlib import Path

import pytest

import attnflow
from attnflow.cli import main
from attnflow.registry import EXPERIMENT_MODULES, SWEEPING, load_all, runs_sweeps


def _modules() -> dict[str, tuple[ast.Module, bool]]:
    root = Path(attnflow.__file__).parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (ast.parse(path.read_text()), path.name == "__init__.py")
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def sweeping_experiments() -> tuple[set[str], set[str]]:
    """(experiments whose function calls `attnflow.sweep.sweep`, directly or through attnflow
    functions that do, every registered experiment), read from the source of attnflow."""
    mods = _modules()
    funcs: dict[tuple[str, str], ast.AST] = {}
    names: dict[str, dict[str, tuple[str, ...]]] = {}  # per module: local name -> ("module", m) | ("attr", m, n)
    for mod, (tree, is_package) in mods.items():
        local: dict[str, tuple[str, ...]] = {}
        for node in ast.walk(tree):  # imports anywhere in the module, also inside functions
            if isinstance(node, ast.ImportFrom):
                target = _absolute(mod, is_package, node)
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    local[a.asname or a.name] = ("module", sub) if sub in mods else ("attr", target, a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    local[a.asname or a.name.split(".")[0]] = ("module", a.name if a.asname else a.name.split(".")[0])
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs[(mod, node.name)] = node
                local[node.name] = ("attr", mod, node.name)
        names[mod] = local

    def where(mod: str, name: str, seen: tuple = ()) -> tuple[str, str]:
        """The (module, name) that defines ``name`` as seen from ``mod`` (through re-exports)."""
        if (mod, name) in funcs or (mod, name) in seen:
            return (mod, name)
        ref = names.get(mod, {}).get(name)
        if ref is not None and ref[0] == "attr" and ref[1:] != (mod, name):
            return where(ref[1], ref[2], (*seen, (mod, name)))
        return (mod, name)

    def callees(mod: str, fn: ast.AST):
        for node in ast.walk(fn):  # nested functions included
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name):
                ref = names[mod].get(f.id)
                if ref is not None and ref[0] == "attr":
                    yield where(ref[1], ref[2])
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                ref = names[mod].get(f.value.id)
                if ref is not None and ref[0] == "module":
                    yield where(ref[1], f.attr)

    sweeping = {("attnflow.sweep", "sweep")}
    grew = True
    while grew:
        grew = False
        for key, fn in funcs.items():
            if key not in sweeping and any(c in sweeping for c in callees(key[0], fn)):
                sweeping.add(key)
                grew = True
    found, registered = set(), set()
    for mod in EXPERIMENT_MODULES:
        for node in mods[mod][0].body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register" and d.args:
                    exp = d.args[0].value
                    registered.add(exp)
                    if (mod, node.name) in sweeping:
                        found.add(exp)
    return found, registered


def _built_in():
    """The experiments of `EXPERIMENT_MODULES` (not those a test registered from its own module)."""
    return {n: e for n, e in load_all().items() if e.fn.__module__ in EXPERIMENT_MODULES}


def test_sweeping_matches_the_source():
    found, registered = sweeping_experiments()
    assert registered == set(_built_in()), "an experiment registered with a name the analysis cannot read"
    assert found == set(SWEEPING), (
        "attnflow.registry.SWEEPING is stale: experiments that call sweep but are not listed: "
        f"{sorted(found - SWEEPING)}; listed but calling no sweep: {sorted(SWEEPING - found)}"
    )
    # the analysis sees direct calls and calls through library functions (qkov.pareto_front)
    assert {"focus-rates", "qkov-optimal-ratio", "finite-size"} <= found and "deep-linear" not in found
    exps = _built_in()
    assert {name for name, e in exps.items() if runs_sweeps(e)} == set(SWEEPING)
    assert all(runs_sweeps(e) is False for name, e in exps.items() if name not in SWEEPING)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shard", "1/2"], "--shard 1/2: deep-linear runs no sweep, so there is nothing to share"),
        (["--merge"], "--merge: deep-linear runs no sweep, so it has no shards to merge; run it without --merge"),
        (["--chunk-size", "3"], "--chunk-size 3: deep-linear runs no sweep, so it saves no chunks"),
    ],
)
def test_shard_and_merge_of_an_experiment_without_sweeps_exit_2_before_computing(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "deep-linear", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()
