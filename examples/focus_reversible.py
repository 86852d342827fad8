"""Does the general Stage II formula predict focus for random chains with the same pi?

The registered experiments measure the focus rate c on lazy chains only, where
c = tau lam |ell| Var_pi(pi) Cov_pi(pi, log pi) / |pi|^5 > 0 for lam > 0. Here we draw random
reversible chains with the reference pi = (0.75, 0.19, 0.05, 0.01) (`MarkovChain.reversible`,
a sweep axis: the chain is built inside the compiled call from a traced key) and ask:

- does the general formula c = tau Var_pi(gamma) Cov_{pi,P}(gamma(X_t), beta(X_{t+1})) at
  theta_c^1 give the measured growth rate of the attention weights (its size |c|), and
- does its sign say whether attention focuses on the frequent token (kappa > 0, the pi-weighted
  attention entropy falls) or turns away from it (kappa < 0, the entropy rises)?

Each flow starts on theta_c^1 (W0, W1 at the condensation point, WQ, WK at their O(eps) initial
draw), where the attention block has eigenvalues +c and -c: the symmetric mode (WQ = WK) grows
when c > 0, the antisymmetric one (WQ = -WK) when c < 0, at rate |c| either way.
Run: python examples/focus_reversible.py (writes focus_reversible.png to the current folder).
"""

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

import attnflow as af
from attnflow import focus

af.enable_x64()

KEYS = np.array([1, 3, 4, 5, 6, 7, 9, 10, 11])  # chains with |c| >= 0.01 (escape within T)
T = 300.0
base = focus.Setup(m=4, mk=4)
c1 = focus.critical_point_c1(base.chain.pi, jnp.eye(base.m)[0])
residue = base.theta0()
theta_c1 = {"W0": c1["W0"], "W1": c1["W1"], "WQ": residue["WQ"], "WK": residue["WK"]}


def q_minus(theta, setup):
    """The antisymmetric attention mode |alpha1^T (WQ - WK)| / sqrt 2 (grows when c < 0)."""
    return {"q_minus": focus.redistribution(theta, setup.chain.pi)["q_minus"]}


def flow(key):
    setup = base.replace(chain=focus.MarkovChain.reversible(focus.SYNTHETIC_PI, key=key))
    c = focus.stage_predictions(setup)["c"]
    return c, focus.solve(setup, T, initial=theta_c1, save=af.LinearGrid(301), observe=q_minus)


res = af.sweep(flow, {"key": KEYS}, progress=False)
c_pred, tr = np.asarray(res.values[0]), res.values[1]
ts = np.asarray(tr.ts[0])
H_pi = float(base.chain.entropy())
rows = []
print(
    f"{'key':>4s} {'c predicted':>12s} {'|c| measured':>13s} {'rel. error':>10s} {'kappa(T)':>10s} "
    f"{'entropy(T) - H(pi)':>19s}"
)
for i, key in enumerate(KEYS):
    q = np.maximum(np.asarray(tr["q_plus"][i]), np.asarray(tr["q_minus"][i]))
    rate = af.growth_rate(ts, q, 10 * q[0], 0.05)
    kappa, dH = float(tr["kappa"][i, -1]), float(tr["entropy"][i, -1]) - H_pi
    rows.append((c_pred[i], rate, kappa, dH))
    print(f"{key:4d} {c_pred[i]:12.5f} {rate:13.5f} {abs(rate / abs(c_pred[i]) - 1):10.2e} {kappa:10.3g} {dH:19.4f}")
rows = np.asarray(rows)
worst = float(np.max(np.abs(rows[:, 1] / np.abs(rows[:, 0]) - 1)))
agree = bool(np.all(np.sign(rows[:, 0]) == np.sign(rows[:, 2])) and np.all(np.sign(rows[:, 0]) == -np.sign(rows[:, 3])))
print(
    f"worst relative error of |c|: {worst:.2e}; sign(c) = sign(kappa) = -sign(entropy change) for every chain: {agree}"
)

fig = Figure(figsize=(10, 3.8), layout="constrained")
a1, a2 = fig.subplots(1, 2)
lim = 1.1 * np.max(np.abs(rows[:, 0]))
a1.plot([-lim, lim], [-lim, lim], "k--", lw=1, label="measured = predicted")
a1.plot(
    rows[:, 0],
    np.sign(rows[:, 2]) * rows[:, 1],
    "o",
    mfc="none",
    ms=8,
    label="growth rate of the attention mode x sign(kappa)",
)
a1.set_xlabel("c predicted (general formula at theta_c^1)")
a1.set_ylabel("c measured")
a1.set_title("Random reversible chains, same pi")
a1.legend(fontsize=7)
a1.locator_params(axis="x", nbins=5)
a1.grid(alpha=0.3)
labelled = set()
for i in range(len(KEYS)):
    focusing = bool(rows[i, 0] > 0)
    label = None if focusing in labelled else ("c > 0: focus" if focusing else "c < 0: away")
    labelled.add(focusing)
    a2.plot(ts, np.asarray(tr["entropy"][i]), color="C0" if focusing else "C3", lw=1.2, label=label)
a2.axhline(H_pi, color="k", ls=":", lw=1, label=f"H(pi) = {H_pi:.3f}")
a2.set_xlabel("t (flow from theta_c^1)")
a2.set_ylabel("pi-weighted attention entropy")
a2.set_title("Entropy: c > 0 focus (blue), c < 0 away (red)")
a2.legend(fontsize=7, loc="upper left")
a2.grid(alpha=0.3)
af.save_figure(fig, "focus_reversible.png")
print("saved focus_reversible.png")
