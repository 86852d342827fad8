"""A user's own experiments in the ``attnflow`` command: ``--import``, ``$ATTNFLOW_EXPERIMENTS``
and the ``attnflow.experiments`` entry-point group (`attnflow.registry.load_all`)."""

import importlib.metadata
import json
import textwrap

import pytest

from attnflow import registry
from attnflow.cli import main
from attnflow.report import get_experiment

# a user's experiment: a sweep of x**2 over a grid, checked against the sum written out
SOURCE = textwrap.dedent(
    """
    from dataclasses import dataclass

    import jax.numpy as jnp

    import attnflow as af
    from attnflow.report import Report, register


    @dataclass(frozen=True)
    class Config:
        top: float = 3.0  # largest x
        n: int = 8  # grid points


    @register("{name}", config=Config, description="a user's sweep of x**2", sweeps=True)
    def run(cfg: Config, quiet: bool) -> Report:
        res = af.sweep(lambda x: {{"y": x**2}}, {{"x": jnp.linspace(0.0, cfg.top, cfg.n)}}, progress=False)
        report = Report("{name}", cfg)
        report.summary["sum"] = float(jnp.sum(res["y"]))
        exact = sum((cfg.top * i / (cfg.n - 1)) ** 2 for i in range(cfg.n))
        report.check("sum vs exact", abs(report.summary["sum"] - exact), 1e-9)
        return report
    """
)


def _write(folder, module, name):
    path = folder / f"{module}.py"
    path.write_text(SOURCE.format(name=name))
    return path


def _summary(out, name):
    return json.loads((out / name / "summary.json").read_text())


def test_import_file_lists_shows_and_runs_it(tmp_path, capsys):
    path = _write(tmp_path, "lab_file_a", "lab-a")
    assert main(["list", "--import", str(path)]) == 0
    assert "lab-a" in capsys.readouterr().out
    assert main(["show", "lab-a", "--import", str(path)]) == 0
    assert "  --set top=3.0   float; largest x\n  --set n=8       int; grid points\n" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["run", "lab-a", "--import", str(path), "--set", "top=2", "--out", str(out), "--quiet"]) == 0
    s = _summary(out, "lab-a")
    assert s["config"] == {"top": 2.0, "n": 8} and s["passed"]
    assert s["summary"]["sum"] == pytest.approx(sum((2 * i / 7) ** 2 for i in range(8)), rel=1e-12)
    assert get_experiment("lab-a").package == "lab_file_a"


# a user's configuration whose options are explained by the comments ending their lines
COMMENTED = textwrap.dedent(
    """
    from dataclasses import dataclass

    from attnflow.report import Report, option, register


    @dataclass(frozen=True)
    class Base:
        seed: int = 0  # random seed of the data
        width: int = 3  # columns of the grid


    @dataclass(frozen=True)
    class Config(Base):
        \"\"\"Options of lab-comments.\"\"\"

        # a comment above a field is not its meaning
        s: float = 2.0             # mode strength
        lams: tuple[float, ...] = (
            0.5,  # an item's comment, not the option's
            0.7,
        )  # strengths swept
        tol: float = option(1e-6, "the check's tolerance")  # metadata wins over this comment
        width: int = 4  # noqa: E501 (a tool's directive: the meaning stays the base's)
        k: int = 2  # type: ignore
        n: int = 8

        class Inner:
            n: int = 1  # not an option of Config


    @register("lab-comments", config=Config, description="comments as meanings", sweeps=False)
    def run(cfg, quiet):
        return Report("lab-comments", cfg)
    """
)


def test_show_takes_an_options_meaning_from_the_comment_ending_its_line(tmp_path, capsys):
    path = tmp_path / "lab_comments.py"
    path.write_text(COMMENTED)
    assert main(["show", "lab-comments", "--import", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "lab-comments [lab_comments]: comments as meanings",
        "options (--set KEY=VALUE, shown at their defaults):",
        "  --set seed=0              int; random seed of the data",
        "  --set width=4             int; columns of the grid",
        "  --set s=2.0               float; mode strength",
        "  --set 'lams=[0.5, 0.7]'   list of float; strengths swept",
        "  --set tol=1e-06           float; the check's tolerance",
        "  --set k=2                 int",
        "  --set n=8                 int",
    ]


def test_option_notes_of_a_class_without_source_are_its_help_alone():
    from attnflow.report import option_notes

    namespace = {"__name__": "lab_without_a_file"}
    exec(
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class Config:\n"
        "    a: int = 1  # not readable: the class has no source file\n"
        "    b: int = field(default=2, metadata={'help': 'kept'})\n",
        namespace,
    )
    assert option_notes(namespace["Config"]) == {"b": "kept"}


def test_shards_of_a_users_experiment_merge_to_the_plain_run(tmp_path, monkeypatch):
    """The module named in $ATTNFLOW_EXPERIMENTS, found in the working folder as `python -m` would."""
    _write(tmp_path, "lab_env_b", "lab-b")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(registry.EXPERIMENTS_ENV, " lab_env_b , ")
    sets = ["--set", "n=16", "--quiet"]
    assert main(["run", "lab-b", *sets, "--out", "plain"]) == 0
    assert main(["run", "lab-b", *sets, "--out", "sharded", "--shard", "1/2"]) == 0
    assert main(["run", "lab-b", *sets, "--out", "sharded", "--shard", "2/2"]) == 0
    assert main(["run", "lab-b", *sets, "--out", "sharded", "--merge"]) == 0
    merged = _summary(tmp_path / "sharded", "lab-b")
    assert merged["summary"] == _summary(tmp_path / "plain", "lab-b")["summary"]
    assert any("2 of the 2 sweep chunks were loaded" in n for n in merged["notes"])
    assert merged["environment"]["sweep_chunks"] == {"total": 2, "computed": 0, "loaded": 2}
    md = (tmp_path / "sharded" / "lab-b" / "summary.md").read_text()
    assert md.split("| timing | seconds |")[1].split("\n\n")[1] == (
        "Timings: this run computed none of its 2 sweep chunks, it loaded them from disk (computed earlier), so "
        "the timings include no sweep computation."
    )


def test_entry_point_adds_experiments(tmp_path, monkeypatch, capsys):
    _write(tmp_path, "lab_ep_c", "lab-c")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="lab", value="lab_ep_c", group=registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        return (ep,) if kw.get("group") == registry.ENTRY_POINT_GROUP else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert "lab-c" in registry.load_all()
    assert main(["list"]) == 0
    assert "lab-c" in capsys.readouterr().out


@pytest.mark.parametrize(
    "source, message",
    [
        ("missing_dir/lab.py", "--import 'missing_dir/lab.py': no such file"),
        ("no_such_lab_module", "--import 'no_such_lab_module': no module named 'no_such_lab_module'"),
        ("json_clash/json.py", "a module named 'json' is already imported"),
        ("broken_lab.py", "importing experiments failed: ZeroDivisionError: division by zero"),
        ("shadow_lab.py", "experiment 'qkov-reduced' is already registered by attnflow.qkov.experiments.qkov_reduced"),
    ],
)
def test_bad_import_is_one_line_exit_2(source, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "json_clash").mkdir()
    (tmp_path / "json_clash" / "json.py").write_text("")
    (tmp_path / "broken_lab.py").write_text("1 / 0\n")
    # a copied-and-edited recipe keeping a built-in's name would silently replace it
    (tmp_path / "shadow_lab.py").write_text(SOURCE.replace("def run(", "def qkov_reduced(").format(name="qkov-reduced"))
    assert main(["list", "--import", source]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_unknown_experiment_suggests_the_closest(capsys):
    assert main(["show", "qkov-reducd"]) == 2
    assert "did you mean 'qkov-reduced'" in capsys.readouterr().err


def test_the_reproduce_index_writes_checks_as_each_experiment_does(tmp_path):
    """OUT/summary.json of reproduce: each check as {value, tolerance, ok}, like OUT/NAME/summary.json."""
    from attnflow.cli import _run_one, _write_index

    _write(tmp_path, "lab_index_d", "lab-d")
    registry.import_experiments(str(tmp_path / "lab_index_d.py"))
    result = _run_one(get_experiment("lab-d"), {}, tmp_path, quiet=True)
    _write_index(tmp_path, [result], 1.0)
    index = json.loads((tmp_path / "summary.json").read_text())["experiments"][0]["checks"]
    own = _summary(tmp_path, "lab-d")["checks"]
    assert index == own and set(own["sum vs exact"]) == {"value", "tolerance", "ok"}


def test_run_help_with_a_broken_import_says_why_the_options_are_missing(tmp_path, monkeypatch, capsys):
    """``attnflow run NAME --help`` never reaches the run that reports a broken module: the help
    says why the experiment's options are not shown, instead of a traceback."""
    (tmp_path / "broken_help_lab.py").write_text("import no_such_package_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNFLOW_EXPERIMENTS", "broken_help_lab.py")
    with pytest.raises(SystemExit) as stop:
        main(["run", "qkov-reduced", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert (
        "options are not shown: importing experiments failed: ModuleNotFoundError: "
        "No module named 'no_such_package_xyz'" in out
    )
