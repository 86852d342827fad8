"""How sharp is the attention at a fixed loss, as a function of the number of classes M?

More classes make the same loss harder to reach (the loss starts at log M): does the network
get there with a larger OV margin or with sharper attention, and does a faster QK circuit
still sharpen it? The fixed-loss solver `attnflow.qkov.state_at_loss` answers without integrating
(one `attnflow.sweep` over M, a static axis, and r = eta_QK / eta_OV); the r = 1 point is checked
against an event-terminated solve of the reduced ODE at the two extreme M.

Run: python examples/qkov_attention_vs_classes.py   (prints a table, writes qkov_attention_vs_classes.png)
"""

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

import attnflow as af
from attnflow import qkov

af.enable_x64()

CLASSES = (2, 3, 5, 10, 20, 50, 100)
RATIOS = np.array([0.1, 1.0, 10.0])  # r = eta_QK / eta_OV, eta_OV = 1
LOSS = 0.01  # the fixed loss L*

# the authors' m, n, b with M classes; M sets shapes (a Static axis: one compiled program per M), r is vectorised
states = af.sweep(
    lambda M, r: qkov.state_at_loss(qkov.paper_setup(r, M=M), LOSS),
    {"M": af.Static(CLASSES), "r": RATIOS},
    progress=False,
).values
alpha, mu_ov = np.asarray(states["alpha"]), np.asarray(states["mu_ov"])  # (M, r)
check = []
for i in (0, len(CLASSES) - 1):  # integrate to the loss at the extreme M: the same state
    ev = qkov.solve(qkov.paper_setup(1.0, M=CLASSES[i]), 1e9, loss_target=LOSS, save=af.LinearGrid(2))
    check.append(abs(float(ev.final()["alpha"]) - alpha[i, 1]))

print(f"attention alpha and OV margin mu_OV at loss {LOSS} (m, n, b = 5, 50, 50; alpha(0) = {5 / 55:.3f})")
print(
    f"{'M':>5} "
    + " ".join(f"{'alpha r=' + format(float(r), 'g'):>13}" for r in RATIOS)
    + "   "
    + " ".join(f"{'mu_OV r=' + format(float(r), 'g'):>13}" for r in RATIOS)
)
for i, M in enumerate(CLASSES):
    print(f"{M:>5} " + " ".join(f"{a:13.4f}" for a in alpha[i]) + "   " + " ".join(f"{m:13.2f}" for m in mu_ov[i]))
print(f"fixed-loss solver vs integrated solve (r = 1, M = 2 and 100), max |alpha difference|: {max(check):.1e}")
print(
    "alpha at M = 100 over alpha at M = 2: "
    + ", ".join(f"r={float(r):g}: {alpha[-1, j] / alpha[0, j]:.2f}" for j, r in enumerate(RATIOS))
)

fig = Figure(figsize=(9.0, 3.4), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
for j, r in enumerate(RATIOS):
    ax1.semilogx(CLASSES, alpha[:, j], "o-", label=f"r = {float(r):g}")
    ax2.loglog(CLASSES, mu_ov[:, j], "o-", label=f"r = {float(r):g}")
ax1.set_ylabel(f"attention alpha at loss {LOSS}")
ax2.set_ylabel(f"OV margin mu_OV at loss {LOSS}")
margins = [8, 10, 15, 20, 30, 40]
ax2.set_yticks(margins, [f"{v:g}" for v in margins])
ax2.yaxis.set_minor_formatter(NullFormatter())
for ax in (ax1, ax2):
    ax.set_xlabel("number of classes M")
    ax.set_xticks([2, 5, 10, 20, 50, 100], ["2", "5", "10", "20", "50", "100"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3, which="both")
# one legend for both panels, outside them: inside, it would cover points of one of the curves
ax2.legend(fontsize=7, title="r = eta_QK / eta_OV", title_fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
fig.suptitle("Reduced CACO dynamics: the state at a fixed loss against the number of classes")
af.save_figure(fig, "qkov_attention_vs_classes.png")
