"""Bring your own model: the order-parameter ODE of online SGD, derived automatically.

Write a student as a function of its ``K`` local fields ``lambda = W x / sqrt(D)`` (and its
readout ``v``), a teacher as a function of its ``M`` fields ``nu = W* x / sqrt(D)``, and a loss;
`solve` integrates the ``D -> infinity`` ODE of the overlaps ``R = W W*^T / D``,
``Q = W W^T / D`` and the readout (Saad & Solla 1995; Goldt et al. 2019), with
``delta = -d loss / d lambda`` by autodiff and the Gaussian expectations by quadrature; `train`
runs online SGD of the same functions at finite ``D``. ``data=SingleLocation(prior, L)`` derives
the ODE for the single-location token model of `attnflow.heads` instead (`SingleLocation`).

```python
import jax.numpy as jnp
import attnflow as af
from attnflow import derive

af.enable_x64()                          # the theory runs in float64
s = derive.Setup(derive.soft_committee, derive.soft_committee,
                 R0=jnp.array([[0.2, 0.0], [0.0, 0.1]]), Q0=0.5 * jnp.eye(2), eta=1.0)
th = derive.solve(s, 100.0)              # the derived ODE
sim = derive.train(s, 100.0, key=0)      # online SGD at D = 1000, t = steps / D
```
"""

from .data import DataModel as DataModel
from .data import GaussianInputs as GaussianInputs
from .data import SingleLocation as SingleLocation
from .data import signal_token as signal_token
from .observe import OBSERVABLES as OBSERVABLES
from .observe import model_observables as model_observables
from .observe import state_observables as state_observables
from .observe import weight_observables as weight_observables
from .setup import HERMITE_BUDGET as HERMITE_BUDGET
from .setup import KINK_TOLERANCE as KINK_TOLERANCE
from .setup import NOISE_POINTS as NOISE_POINTS
from .setup import GaussHermite as GaussHermite
from .setup import MonteCarlo as MonteCarlo
from .setup import Quadrature as Quadrature
from .setup import QuasiMonteCarlo as QuasiMonteCarlo
from .setup import Setup as Setup
from .setup import SparseGaussHermite as SparseGaussHermite
from .setup import default_quadrature as default_quadrature
from .setup import erf_activation as erf_activation
from .setup import scaled_rule as scaled_rule
from .setup import soft_committee as soft_committee
from .setup import squared_loss as squared_loss
from .theory import DEFAULT_SAVE as DEFAULT_SAVE
from .theory import DEFAULT_SOLVER as DEFAULT_SOLVER
from .theory import NODE_CHUNK as NODE_CHUNK
from .theory import Plateau as Plateau
from .theory import Rule as Rule
from .theory import covariance as covariance
from .theory import escape_time as escape_time
from .theory import expectations as expectations
from .theory import field as field
from .theory import generalisation_error as generalisation_error
from .theory import initial_state as initial_state
from .theory import ode as ode
from .theory import plateau as plateau
from .theory import rule as rule
from .theory import solve as solve
from .theory import symmetrised as symmetrised
from .theory import vector_field as vector_field
from .train import DEFAULT_TRAIN_SAVE as DEFAULT_TRAIN_SAVE
from .train import REFERENCE_D as REFERENCE_D
from .train import train as train
from .train import weights_from_overlaps as weights_from_overlaps

__all__ = [
    "escape_time",
    "Rule",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEFAULT_TRAIN_SAVE",
    "HERMITE_BUDGET",
    "NOISE_POINTS",
    "KINK_TOLERANCE",
    "NODE_CHUNK",
    "OBSERVABLES",
    "REFERENCE_D",
    "DataModel",
    "GaussianInputs",
    "GaussHermite",
    "MonteCarlo",
    "QuasiMonteCarlo",
    "SparseGaussHermite",
    "Quadrature",
    "Setup",
    "SingleLocation",
    "covariance",
    "default_quadrature",
    "erf_activation",
    "expectations",
    "field",
    "generalisation_error",
    "initial_state",
    "rule",
    "scaled_rule",
    "signal_token",
    "soft_committee",
    "ode",
    "model_observables",
    "plateau",
    "Plateau",
    "symmetrised",
    "solve",
    "squared_loss",
    "state_observables",
    "train",
    "vector_field",
    "weight_observables",
    "weights_from_overlaps",
]
