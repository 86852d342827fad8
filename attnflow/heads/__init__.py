"""Head specialisation in the high-dimensional single-location model (multi-head attention,
online SGD, order-parameter ODEs).

```python
import attnflow as af
from attnflow import heads

af.enable_x64()
s = heads.Setup()                       # softmax, H = 2, L = 4, flipped spike s = 3, eta = 1
th = heads.solve(s, 8.0)                # the order-parameter ODE from the overlaps of a D = 1000 draw
sim = heads.train(s, 8.0, key=0)        # online SGD at D = 1000 from exactly those overlaps
af.compare(th, sim)                     # max |theory - SGD| per observable
```

The mathematics, the symbols and the measured numbers are on the heads page of the docs.
"""

from .data import AnisotropicGaussian as AnisotropicGaussian
from .data import Discrete as Discrete
from .data import FlippedSpike as FlippedSpike
from .data import PointMass as PointMass
from .data import Prior as Prior
from .data import ScalarTarget as ScalarTarget
from .data import SingleLocationTask as SingleLocationTask
from .data import Target as Target
from .data import TokenTarget as TokenTarget
from .metrics import BAYES_SAMPLES as BAYES_SAMPLES
from .metrics import BAYES_SEED as BAYES_SEED
from .metrics import ByMass as ByMass
from .metrics import GivenOrder as GivenOrder
from .metrics import Greedy as Greedy
from .metrics import PruneOrder as PruneOrder
from .metrics import RandomOrder as RandomOrder
from .metrics import bayes_posterior as bayes_posterior
from .metrics import bayes_risk as bayes_risk
from .metrics import oracle_config as oracle_config
from .metrics import prune as prune
from .metrics import softmax_floor as softmax_floor
from .model import Activation as Activation
from .model import BayesSoftmax as BayesSoftmax
from .model import MultiHead as MultiHead
from .model import Softmax as Softmax
from .model import Softmax1 as Softmax1
from .model import half_loss as half_loss
from .model import sample_loss as sample_loss
from .observe import OBSERVABLES as OBSERVABLES
from .observe import model_observables as model_observables
from .observe import order_parameter_observables as order_parameter_observables
from .observe import overlaps as overlaps
from .observe import specialisation as specialisation
from .sensitivity import SPECIALISATION_HORIZON as SPECIALISATION_HORIZON
from .sensitivity import escape_time as escape_time
from .sensitivity import escape_time_sensitivity as escape_time_sensitivity
from .sensitivity import specialisation_time as specialisation_time
from .sensitivity import specialisation_time_sensitivity as specialisation_time_sensitivity
from .setup import INIT_SEED as INIT_SEED
from .setup import REFERENCE_D as REFERENCE_D
from .setup import REFERENCE_ETA as REFERENCE_ETA
from .setup import REFERENCE_SIGMA0 as REFERENCE_SIGMA0
from .setup import REFERENCE_SIGNAL as REFERENCE_SIGNAL
from .setup import FiniteDDraw as FiniteDDraw
from .setup import InitialCondition as InitialCondition
from .setup import Overlaps as Overlaps
from .setup import Setup as Setup
from .setup import SymmetricSeed as SymmetricSeed
from .setup import check_overlaps as check_overlaps
from .setup import from_finite_D as from_finite_D
from .setup import symmetric_seed as symmetric_seed
from .theory import BANK_SEED as BANK_SEED
from .theory import DEFAULT_BANK_SIZE as DEFAULT_BANK_SIZE
from .theory import DEFAULT_SAVE as DEFAULT_SAVE
from .theory import DEFAULT_SOLVER as DEFAULT_SOLVER
from .theory import ESCAPE_THRESHOLD as ESCAPE_THRESHOLD
from .theory import EVAL_STREAM as EVAL_STREAM
from .theory import PSD_TOLERANCE as PSD_TOLERANCE
from .theory import SLOW_RELAXATION as SLOW_RELAXATION
from .theory import AllPermutations as AllPermutations
from .theory import AutodiffForm as AutodiffForm
from .theory import BankOptions as BankOptions
from .theory import CholeskyRoot as CholeskyRoot
from .theory import CyclicCopies as CyclicCopies
from .theory import DriftForm as DriftForm
from .theory import Dynamics as Dynamics
from .theory import ExpectationForm as ExpectationForm
from .theory import FieldBank as FieldBank
from .theory import HeadCopies as HeadCopies
from .theory import MatrixRoot as MatrixRoot
from .theory import NoCopies as NoCopies
from .theory import SteinForm as SteinForm
from .theory import SymmetricRoot as SymmetricRoot
from .theory import antisymmetric_basis as antisymmetric_basis
from .theory import drifting_escape_time as drifting_escape_time
from .theory import feature_escape_times as feature_escape_times
from .theory import generalisation_error as generalisation_error
from .theory import half_risk as half_risk
from .theory import initial_state as initial_state
from .theory import ode as ode
from .theory import order_parameter_field as order_parameter_field
from .theory import plateau_rates as plateau_rates
from .theory import plateau_state as plateau_state
from .theory import predicted_escape_time as predicted_escape_time
from .theory import solve as solve
from .theory import specialisation_spectrum as specialisation_spectrum
from .theory import symmetrise as symmetrise
from .theory import unspecialised_point as unspecialised_point
from .train import DEFAULT_TRAIN_SAVE as DEFAULT_TRAIN_SAVE
from .train import EVAL_SAMPLES as EVAL_SAMPLES
from .train import EVAL_SEED as EVAL_SEED
from .train import REFERENCE_T as REFERENCE_T
from .train import TASK_SEED as TASK_SEED
from .train import TRAIN_TOLERANCE as TRAIN_TOLERANCE
from .train import keys_from_overlaps as keys_from_overlaps
from .train import train as train

__all__ = [
    "BANK_SEED",
    "EVAL_STREAM",
    "BAYES_SAMPLES",
    "BAYES_SEED",
    "DEFAULT_BANK_SIZE",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEFAULT_TRAIN_SAVE",
    "ESCAPE_THRESHOLD",
    "SLOW_RELAXATION",
    "EVAL_SAMPLES",
    "EVAL_SEED",
    "INIT_SEED",
    "OBSERVABLES",
    "PSD_TOLERANCE",
    "REFERENCE_D",
    "REFERENCE_ETA",
    "REFERENCE_SIGMA0",
    "REFERENCE_SIGNAL",
    "SPECIALISATION_HORIZON",
    "TASK_SEED",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "Activation",
    "AllPermutations",
    "AnisotropicGaussian",
    "AutodiffForm",
    "BankOptions",
    "BayesSoftmax",
    "ByMass",
    "CholeskyRoot",
    "CyclicCopies",
    "Discrete",
    "DriftForm",
    "Dynamics",
    "ExpectationForm",
    "FieldBank",
    "FiniteDDraw",
    "FlippedSpike",
    "GivenOrder",
    "Greedy",
    "HeadCopies",
    "InitialCondition",
    "MatrixRoot",
    "MultiHead",
    "NoCopies",
    "Overlaps",
    "PointMass",
    "Prior",
    "PruneOrder",
    "RandomOrder",
    "ScalarTarget",
    "Setup",
    "SingleLocationTask",
    "Softmax",
    "Softmax1",
    "SteinForm",
    "SymmetricRoot",
    "SymmetricSeed",
    "Target",
    "TokenTarget",
    "antisymmetric_basis",
    "bayes_posterior",
    "bayes_risk",
    "check_overlaps",
    "feature_escape_times",
    "from_finite_D",
    "generalisation_error",
    "half_loss",
    "half_risk",
    "initial_state",
    "keys_from_overlaps",
    "model_observables",
    "oracle_config",
    "order_parameter_field",
    "order_parameter_observables",
    "overlaps",
    "predicted_escape_time",
    "prune",
    "sample_loss",
    "softmax_floor",
    "ode",
    "solve",
    "specialisation",
    "drifting_escape_time",
    "plateau_rates",
    "plateau_state",
    "specialisation_spectrum",
    "specialisation_time",
    "specialisation_time_sensitivity",
    "escape_time",
    "escape_time_sensitivity",
    "symmetric_seed",
    "symmetrise",
    "train",
    "unspecialised_point",
]
