"""README example: Saxe mode ODE (theory) overlaid on gradient descent (simulation)."""

import jax.numpy as jnp
import optax

import attnflow as af
from attnflow.deeplinear import Teacher, TwoLayerLinear, mode_field, population_loss

af.enable_x64()
teacher = Teacher([3.0, 2.0, 1.0, 0.5], n_in=8, n_out=6)
theory = af.integrate(mode_field, jnp.full(4, 1e-3), 14.0, args={"s": teacher.s, "tau": 1.0},
                      observe=lambda t, u, a: {"u": u})
eta = 0.01
sim = af.simulate(lambda m, _: population_loss(m.W1, m.W2, teacher.A), TwoLayerLinear.aligned(teacher, 1e-3),
                  optax.sgd(eta), steps=1400, observe=lambda m: {"u": teacher.modes(m.product)}, clock=eta)
print(af.compare(theory, sim))
af.save_figure(af.overlay(theory, sim, ["u"]), "overlay.png")
