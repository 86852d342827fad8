"""The finite-size law: `fit_finite_size`, `trajectory_gap`, each theory's gap at two sizes, and the
``finite-size`` experiment."""

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow import focus, heads, qkov


# ----------------------------------------------------------------------------- fit_finite_size
def test_fit_is_exact_on_an_exact_power_law():
    sizes = np.array([100.0, 200.0, 400.0, 800.0])
    gaps = 3.0 * sizes[:, None] ** -0.5 * np.ones((4, 3))
    f = af.fit_finite_size(sizes, gaps)
    assert f.exponent == pytest.approx(-0.5, abs=1e-12)
    assert f.prefactor == pytest.approx(3.0, rel=1e-12)
    assert f.stderr == pytest.approx(0.0, abs=1e-12) and f.r2 == pytest.approx(1.0)
    assert f.n == 12 and f.gaps.shape == (4, 3) and f.mean_gaps == pytest.approx(3.0 * sizes**-0.5)
    assert f.predict([1600.0]) == pytest.approx([3.0 / 40.0])
    assert f.label() == "p = -0.50 ± 0.00"
    one_per_size = af.fit_finite_size(sizes, gaps[:, 0])  # (S,) gaps: one point per size
    assert one_per_size.exponent == pytest.approx(-0.5) and one_per_size.gaps.shape == (4, 1)


def test_fit_recovers_a_known_exponent_and_its_interval_covers_it():
    rng = np.random.default_rng(0)
    sizes = np.array([250.0, 500.0, 1000.0, 2000.0, 4000.0])

    def draw():  # gap = 2 N^(-1/2) with log-normal scatter of width 0.3 per (size, seed)
        return 2.0 * sizes[:, None] ** -0.5 * np.exp(0.3 * rng.standard_normal((5, 6)))

    f = af.fit_finite_size(sizes, draw())
    assert f.exponent == pytest.approx(-0.5, abs=0.1)
    assert f.contains(-0.5) and f.distance(-0.5) == 0.0
    assert f.ci[1] - f.ci[0] == pytest.approx(2 * 2.0484 * f.stderr, rel=1e-3)  # t_{0.975, 28} = 2.0484
    assert f.prefactor == pytest.approx(2.0, rel=0.5)
    assert f.distance(0.0) == pytest.approx(-f.ci[1]) and not f.contains(0.0)
    # the 95% Student-t interval covers the true exponent in about 95% of 400 draws (binomial sd 1.1%)
    covered = np.mean([af.fit_finite_size(sizes, draw()).contains(-0.5) for _ in range(400)])
    assert 0.92 <= covered <= 0.98
    narrow = af.fit_finite_size(sizes, draw(), level=0.5)
    assert narrow.ci[1] - narrow.ci[0] < f.ci[1] - f.ci[0]


@pytest.mark.parametrize(
    ("sizes", "gaps", "kw", "message"),
    [
        ([100, 200, 400], [[0.1, 0.2], [0.05, np.nan], [0.02, 0.03]], {}, r"size 200, seed index 1 is nan"),
        ([100, 200, 400], [0.1, 0.0, 0.02], {}, r"size 200, seed index 0 is 0\.0"),
        ([100, -200, 400], [0.1, 0.05, 0.02], {}, r"sizes\[1\] is -200\.0"),
        ([100, 100, 400], [0.1, 0.05, 0.02], {}, "sizes must be distinct"),
        ([100, 200, 400], [0.1, 0.05], {}, r"shape \(S,\) or \(S, R\) with S = 3 sizes, got \(2,\)"),
        ([100, 200], [0.1, 0.05], {}, "at least 3 .size, seed. points, got 2"),
        ([100], [0.1], {}, "at least 2 sizes"),
        ([100, 200, 400], [0.1, 0.05, 0.02], {"level": 1.5}, r"level must lie in \(0, 1\), got 1\.5"),
        ("big", [0.1], {}, "sizes must be a real number"),
    ],
)
def test_fit_rejects_bad_input_naming_the_value(sizes, gaps, kw, message):
    with pytest.raises(ValueError, match=message):
        af.fit_finite_size(sizes, gaps, **kw)


# ----------------------------------------------------------------------------- trajectory_gap
def _toy():
    t = np.linspace(0.0, 2.0, 21)
    ref = af.Trajectory(t, {"y": 3 * t, "v": np.stack([t, -t], axis=-1)})
    ts = np.linspace(0.0, 2.0, 5)  # another grid: the reference is interpolated (exactly, it is linear)
    offsets = np.array([0.1, 0.2])
    v_off = np.array([0.3, 0.4])  # |v_off| = 0.5
    other = af.Trajectory(
        np.broadcast_to(ts, (2, 5)),
        {
            "y": 3 * ts[None] + offsets[:, None] * (ts[None] > 1.0),  # off by c for t > 1 only
            "v": np.broadcast_to(np.stack([ts, -ts], axis=-1) + v_off, (2, 5, 2)),
        },
    )
    return ref, other


def test_gap_is_the_norm_over_observables_reduced_over_time():
    ref, other = _toy()
    # y: offset c at 2 of 5 times (t = 1.5, 2); v: 0.5 at all 5
    rms_y = af.trajectory_gap(ref, other, ["y"])
    assert rms_y.shape == (2,) and rms_y == pytest.approx(np.array([0.1, 0.2]) * np.sqrt(2 / 5))
    assert af.trajectory_gap(ref, other, ["y"], reduce="max") == pytest.approx([0.1, 0.2])
    assert af.trajectory_gap(ref, other, ["v"]) == pytest.approx([0.5, 0.5])
    both = af.trajectory_gap(ref, other)  # all shared observables: sqrt(mean_t (dy^2 + dv^2))
    assert both == pytest.approx(np.sqrt((np.array([0.1, 0.2]) ** 2 * 2 + 0.25 * 5) / 5))
    single = af.trajectory_gap(ref, other.batch(1), ["y"], reduce="max")
    assert single.shape == () and float(single) == pytest.approx(0.2)
    # batch elements on their own clocks
    ts2 = np.stack([np.linspace(0.0, 2.0, 5), np.linspace(0.0, 1.0, 5)])
    shifted = af.Trajectory(ts2, {"y": 3 * ts2 + 0.05})
    assert af.trajectory_gap(ref, shifted, ["y"]) == pytest.approx([0.05, 0.05])


def test_gap_rejects_bad_input_naming_the_value():
    ref, other = _toy()
    with pytest.raises(ValueError, match="reduce must be 'rms' or 'max', got 'mean'"):
        af.trajectory_gap(ref, other, reduce="mean")
    with pytest.raises(ValueError, match=r"^trajectory_gap: reference has no observable 'loss'; it has \['v', 'y'\]$"):
        af.trajectory_gap(ref, other, ["loss"])
    three = af.Trajectory(np.broadcast_to(np.linspace(0.0, 2.0, 5), (3, 5)), {"y": np.zeros((3, 5))})
    with pytest.raises(ValueError, match=r"reference has batch shape \(3,\) and other \(2,\): trajectory_gap needs"):
        af.trajectory_gap(three, other)
    late = af.Trajectory(np.linspace(0.0, 3.0, 4), {"y": np.zeros(4)})
    with pytest.raises(
        ValueError, match=r"^trajectory_gap: other is saved on \[0, 3\] but reference covers only \[0, 2\]"
    ):
        af.trajectory_gap(ref, late)
    wide = af.Trajectory(np.linspace(0.0, 2.0, 3), {"v": np.zeros((3, 3))})
    with pytest.raises(ValueError, match=r"'v' has shape \(2,\) per save time in reference and \(3,\) in other"):
        af.trajectory_gap(ref, wide)
    with pytest.raises(
        ValueError, match=r"^trajectory_gap: no common observables: reference has \['v', 'y'\], other has \['z'\]"
    ):
        af.trajectory_gap(ref, af.Trajectory(np.linspace(0.0, 1.0, 3), {"z": np.zeros(3)}))


def test_gap_checks_its_input_as_compare_does():
    """trajectory_gap accepts what compare accepts, with compare's messages: one name as a
    string (it was split into characters), per-time shapes that differ but have one size (the
    transpose was compared entry by entry), a float32 clock ending a rounding past a float64
    theory (refused by a second, stricter span check), a SweepResult (pass res.values)."""
    t_ref = np.linspace(0.0, 0.3, 31)
    theory = af.Trajectory(t_ref, {"loss": np.exp(-t_ref), "M": np.zeros((31, 2, 3))})
    t_sim = np.linspace(0.0, 0.3, 7, dtype=np.float32)  # ends at 0.30000001 in float32
    sims = af.Trajectory(np.broadcast_to(t_sim, (3, 7)), {"loss": np.exp(-t_sim)[None].repeat(3, 0) + np.float32(0.01)})
    gap = af.trajectory_gap(theory, sims, "loss", reduce="max")
    np.testing.assert_allclose(gap, af.compare(theory, sims, "loss", per_run=True)["loss"], rtol=1e-6)
    np.testing.assert_allclose(gap, [0.01] * 3, rtol=1e-4)
    late = af.Trajectory(t_sim.astype(np.float64), {"loss": np.exp(-t_sim.astype(np.float64))})
    for f in (af.compare, af.trajectory_gap):  # a float64 clock past the horizon by 1.2e-8: both refuse
        with pytest.raises(
            ValueError,
            match=rf"^{f.__name__}: other is saved on \[0, 0.300000012\] but reference covers only \[0, 0.3\]",
        ):
            f(theory, late)
    transposed = af.Trajectory(t_ref, {"M": np.zeros((31, 3, 2))})
    for f in (af.compare, af.trajectory_gap):
        with pytest.raises(
            ValueError,
            match=rf"^{f.__name__}: observable 'M' has shape \(2, 3\) per save time in reference and \(3, 2\) in other",
        ):
            f(theory, transposed, ["M"])
    res = af.sweep(
        lambda rate: af.Trajectory(jnp.asarray(t_ref), {"loss": rate * jnp.asarray(t_ref)}),
        {"rate": np.arange(2.0)},
        progress=False,
    )
    with pytest.raises(
        ValueError, match=r"^trajectory_gap: other is a SweepResult over \('rate',\); pass its trajectories, res.values"
    ):
        af.trajectory_gap(theory, res)
    np.testing.assert_allclose(
        af.trajectory_gap(theory.select("loss").with_ys(loss=0 * t_ref), res.values, reduce="max"),
        [0.0, 0.3],
        atol=1e-12,
    )


def test_gap_takes_a_batched_reference_as_compare_does():
    """A theory per ``eta`` against runs per ``(eta, seed)``: each curve against the seeds of its
    ``eta``; the same batch shape: run by run; a curve measured against runs past its end is refused."""
    t = np.linspace(0.0, 1.0, 11)
    ref = af.Trajectory(np.stack([t, t]), {"y": np.stack([t, 2 * t])})  # y = a t, a = 1, 2
    offsets = 0.01 * np.arange(3)  # seed k is off by 0.01 k
    runs = af.Trajectory(np.broadcast_to(t, (2, 3, 11)), {"y": np.stack([t, 2 * t])[:, None] + offsets[:, None]})
    gap = af.trajectory_gap(ref, runs, ["y"], reduce="max")
    np.testing.assert_allclose(gap, [[0.0, 0.01, 0.02]] * 2, atol=1e-15)
    np.testing.assert_allclose(gap, af.compare(ref, runs, per_run=True)["y"], atol=1e-15)
    # run by run, on another grid of the same span: the reference is interpolated (exactly: it is linear)
    ts = np.linspace(0.0, 1.0, 4)
    paired = af.Trajectory(np.stack([ts, ts]), {"y": np.stack([ts + 0.1, 2 * ts - 0.3])})
    np.testing.assert_allclose(af.trajectory_gap(ref, paired, ["y"]), [0.1, 0.3])
    # a wrong curve would show: swapping the reference curves gives |a t - a' t| instead
    np.testing.assert_allclose(af.trajectory_gap(ref.batch(np.array([1, 0])), paired, ["y"], reduce="max"), [0.9, 0.7])
    # each curve covers its own runs only
    short = af.Trajectory(np.stack([t, 0.5 * t]), {"y": np.stack([t, t])})
    with pytest.raises(
        ValueError, match=r"other run \(1,\) is saved on \[0, 1\] but reference curve \(1,\) covers only \[0, 0.5\]"
    ):
        af.trajectory_gap(short, paired)
    # a failed reference curve (NaN times, from a sweep) gives NaN for its runs only
    failed = af.Trajectory(np.stack([t, np.full(11, np.nan)]), {"y": np.stack([t, np.full(11, np.nan)])})
    gap = af.trajectory_gap(failed, runs, ["y"], reduce="max")
    np.testing.assert_allclose(gap[0], [0.0, 0.01, 0.02], atol=1e-15)
    assert np.all(np.isnan(gap[1]))


# ----------------------------------------------------------------------------- each theory at two sizes
def test_qkov_gap_falls_as_one_over_the_common_tokens():
    # full-matrix gradient flow against the authors' reduced ODE (kappa = 1, the |C| -> infinity rate): the
    # missing b / |C| in the collapsed-QK rate makes the gap ~ 1 / |C| (measured ratio 3.93 for |C| 50 -> 200)
    grid = af.LinearGrid(9)
    ode = qkov.solve(qkov.Setup(), 400.0, save=grid)
    gaps = [
        float(af.trajectory_gap(ode, qkov.train(qkov.Setup(n_common=C), 400.0, save=grid), ["mu_ov", "mu_qk"]))
        for C in (50, 200)
    ]
    assert gaps[1] == pytest.approx(0.0340, rel=0.05)
    assert gaps[0] / gaps[1] == pytest.approx(4.0, rel=0.05)


def test_heads_sgd_gap_shrinks_with_D():
    # online SGD from the ODE's initial overlaps at D = 250 and 2000 (4 seeds each): the seed-mean gap falls by
    # 3.7 (D^(-1/2) would give 2.8; the 4-seed scatter is large, so the bounds are wide)
    s = heads.Setup(init=heads.FiniteDDraw(0.5, 200, 0))
    grid = af.LinearGrid(9)
    ode = heads.solve(s, 2.0, save=grid, bank=heads.BankOptions(n=4096))
    gaps = []
    for i, D in enumerate((250, 2000)):
        sims = af.sweep(
            lambda seed, D=D: heads.train(s, 2.0, key=seed, D=D, save=grid, eval_samples=0, dtype="float32"),
            {"seed": np.arange(4) + 1000 * i},
            progress=False,
        ).values
        gaps.append(af.trajectory_gap(ode, sims, ["M", "Q"]))
    assert gaps[0].shape == (4,) and np.all(gaps[0] > 0.02) and np.all(gaps[1] < 0.02)
    assert 2.0 < gaps[0].mean() / gaps[1].mean() < 6.0


@pytest.mark.slow
def test_focus_sgd_gap_shrinks_with_context():
    # online SGD on contexts of 8 and 64 tokens (3 seeds each) against the population flow, Stage I: the
    # seed-mean gap falls by 3.8 (the experiment's default widths give s^(-0.9))
    fs = focus.Setup(m=4, mk=4)
    grid, dt = af.LinearGrid(9), 0.04
    _, steps = grid.steps_for(40.0, dt)
    flow = focus.solve(fs, float(dt * steps[-1]), save=af.TimeGrid(dt * steps))
    gaps = []
    for i, ctx in enumerate((8, 64)):
        sims = af.sweep(
            lambda seed, ctx=ctx: focus.train(fs, 40.0, key=seed, dt=dt, context=ctx, batch=16, save=grid),
            {"seed": np.arange(3) + 1000 * i},
            progress=False,
        ).values
        gaps.append(af.trajectory_gap(flow, sims, ["loss", "entropy"]))
    assert np.all(gaps[0] > gaps[1].max())
    assert 2.0 < gaps[0].mean() / gaps[1].mean() < 10.0


# ----------------------------------------------------------------------------- the experiment
@pytest.mark.slow
def test_finite_size_experiment_small(tmp_path):
    from attnflow.citations import keys_for
    from attnflow.registry import get_experiment, load_all

    load_all()
    small = {
        "seeds": 3,
        "n_save": 9,
        "heads_Ds": (500, 1000, 2000, 4000),
        "heads_t_end": 2.0,
        "heads_bank": 4096,
        "qkov_n_commons": (50, 100, 200, 400),
        "qkov_ms": (1, 2, 4, 8),
        "qkov_t_end": 600.0,
        "focus_contexts": (8, 16, 32, 64),
        "focus_context_batch": 16,
        "focus_batches": (1, 2, 4, 8),
        "focus_batch_context": 64,
    }
    rep = get_experiment("finite-size").run(small, quiet=True)
    assert rep.passed, rep.checks
    fig = rep.figures["finite_size"]
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["heads", "qkov", "focus"]
    p, lo, hi, r2 = rep.summary["qkov, N = |C|: exponent p, 95% interval, R^2"]
    assert p == pytest.approx(-0.99, abs=0.03) and lo < p < hi and r2 > 0.999
    assert keys_for("finite-size")[:3] == ["sagitova2026specialization", "vashisht2026faster", "chen2026focus"]
    assert any("Sagitova" in r for r in rep.references)
    out = rep.write(tmp_path)
    assert (out / "finite_size.png").stat().st_size > 20_000
