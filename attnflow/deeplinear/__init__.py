"""Deep linear networks (Saxe, McClelland & Ganguli 2014): the core's validation theory.

A two-layer linear network ``W2 W1`` trained by gradient flow on whitened inputs: each
input-output mode of strength ``s`` follows the closed-form sigmoid
``u(t) = s e^{2 s eta t} / (e^{2 s eta t} - 1 + s/u0)``.

```python
import attnflow as af
from attnflow import deeplinear as dl

af.enable_x64()                     # the theory runs in float64
s = dl.Setup()                      # teacher modes (3, 2, 1, 0.5), u0 = 1e-3, eta = 1
th = dl.solve(s, 8.0)               # the mode ODE
sim = dl.train(s, 8.0, key=0)       # gradient descent of the network, t = dt * step
```
"""

from .data import Teacher as Teacher
from .model import TwoLayerLinear as TwoLayerLinear
from .observe import OBSERVABLES as OBSERVABLES
from .observe import mode_observables as mode_observables
from .observe import model_observables as model_observables
from .setup import REFERENCE_MODES as REFERENCE_MODES
from .setup import TEACHER_SEED as TEACHER_SEED
from .setup import Setup as Setup
from .theory import DEFAULT_SAVE as DEFAULT_SAVE
from .theory import DEFAULT_SOLVER as DEFAULT_SOLVER
from .theory import conserved as conserved
from .theory import escape_time as escape_time
from .theory import escape_time_sensitivity as escape_time_sensitivity
from .theory import factor_field as factor_field
from .theory import matrix_field as matrix_field
from .theory import mode_field as mode_field
from .theory import mode_strength as mode_strength
from .theory import ode as ode
from .theory import population_loss as population_loss
from .theory import solve as solve
from .train import DEFAULT_TRAIN_SAVE as DEFAULT_TRAIN_SAVE
from .train import REFERENCE_T as REFERENCE_T
from .train import TRAIN_TOLERANCE as TRAIN_TOLERANCE
from .train import train as train

__all__ = [
    "escape_time",
    "escape_time_sensitivity",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEFAULT_TRAIN_SAVE",
    "OBSERVABLES",
    "REFERENCE_MODES",
    "Setup",
    "TEACHER_SEED",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "Teacher",
    "TwoLayerLinear",
    "conserved",
    "factor_field",
    "matrix_field",
    "mode_field",
    "mode_observables",
    "mode_strength",
    "model_observables",
    "population_loss",
    "ode",
    "solve",
    "train",
]
