"""The documentation runs: every Python block of README.md and docs/, every script in examples/,
and every public name of the package has a docstring and a place in the API reference."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnflow", "attnflow.deeplinear", "attnflow.qkov", "attnflow.focus", "attnflow.heads", "attnflow.derive")
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def _markdown_with_code() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if BLOCK.search(f.read_text())]


# Runs the Python blocks of one markdown file in order, in one namespace; a failure names the
# block and its first line in the file.
_RUNNER = r"""
import re, sys, traceback
path = sys.argv[1]
text = open(path).read()
pattern = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
ns = {"__name__": "__main__"}
for i, m in enumerate(pattern.finditer(text)):
    line = text[: m.start()].count("\n") + 2
    try:
        exec(compile(m.group(1), f"{path}:{line} (block {i + 1})", "exec"), ns)
    except Exception:
        traceback.print_exc()
        sys.exit(f"block {i + 1} (line {line}) of {path} failed")
"""

# Runs one script as ``python script.py`` would (``__main__``, its path as ``sys.argv[0]``).
_SCRIPT_RUNNER = r"""
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["MPLBACKEND"] = "Agg"
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _run_python(runner: str, path: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``runner`` on ``path`` in a fresh interpreter in ``cwd``; it must exit 0."""
    out = subprocess.run(
        [sys.executable, "-c", runner, str(path)], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


@pytest.mark.parametrize("path", _markdown_with_code(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_python_blocks_run(path, tmp_path):
    _run_python(_RUNNER, path, tmp_path)


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_examples_run(script, tmp_path):
    out = _run_python(_SCRIPT_RUNNER, script, tmp_path)
    assert out.stdout.strip(), f"{script.name} printed nothing"


def test_every_public_name_is_documented_and_in_the_api_reference():
    griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra (mkdocstrings-python)")
    api = "\n".join(p.read_text() for p in sorted((ROOT / "docs" / "api").glob("*.md")))
    directives = {line.strip() for line in api.splitlines() if line.startswith("::: ")}
    missing_doc, missing_ref = [], []
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    for mod_name in PACKAGES:
        mod = loader.load(mod_name)
        loader.resolve_aliases(external=False)
        runtime = __import__(mod_name, fromlist=["__all__"])
        for name in runtime.__all__:
            obj = mod[name]
            target = obj.final_target if obj.is_alias else obj
            ref = f"{mod_name}.{name}"
            if target.is_module:
                value = getattr(runtime, name)
                if isinstance(value, type(sys)):
                    continue
                # A function that shares its name with a submodule (`train`, `af.sweep`): griffe resolves the name
                # to the submodule, so `::: attnflow.heads` leaves it out and `::: attnflow.sweep` renders the
                # module. The page must name the function inside its submodule.
                ref = f"{value.__module__}.{value.__qualname__}"
                target = loader.modules_collection[ref]
                if f"::: {ref}" not in directives:
                    missing_ref.append(f"{mod_name}.{name} (as {ref})")
            elif mod_name == "attnflow" and f"::: {ref}" not in directives:
                missing_ref.append(ref)
            if target.docstring is None or not target.docstring.value.strip():
                missing_doc.append(ref)
        if mod_name != "attnflow" and f"::: {mod_name}" not in directives:
            missing_ref.append(mod_name)
    assert not missing_doc, f"public names without a docstring: {missing_doc}"
    assert not missing_ref, f"public names missing from docs/api/*.md: {missing_ref}"


def test_no_file_names_a_path_outside_the_repository():
    bad = []
    for p in [*(ROOT / "attnflow").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        text = p.read_text()
        name = str(p.relative_to(ROOT))
        for pattern in ("../shared", "parents[2]", "parents[3]", "jax._src"):
            if pattern in text:
                bad.append(f"{name}: {pattern}")
    assert not bad, bad


def test_the_jax_floor_is_what_the_docs_say_and_what_the_suite_runs():
    """pyproject.toml's floors for jax and jaxlib are the versions the suite runs (no older JAX has
    ``jax.shard_map(check_vma=...)`` or ``jax.enable_x64`` as a context manager), and docs/gpu.md
    states them."""
    import tomllib
    from importlib.metadata import version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = dict(re.fullmatch(r"([\w-]+)>=([\d.]+)", d.replace(" ", "")).groups() for d in deps)
    gpu = (ROOT / "docs" / "gpu.md").read_text()
    for name in ("jax", "jaxlib"):
        floor = tuple(int(p) for p in floors[name].split("."))
        installed = tuple(int(p) for p in re.match(r"\d+\.\d+", version(name)).group().split("."))
        assert installed >= floor, f"{name} {version(name)} is older than the floor {floors[name]}"
        assert f"`{name}>={floors[name]}`" in gpu, f"docs/gpu.md does not state {name}>={floors[name]}"
    assert floors["jax"] == floors["jaxlib"]
