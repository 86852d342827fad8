"""Focus and dilution: the multi-stage learning of one-layer attention on Markov data.

A one-layer, single-head attention model trained from small initialisation on a first-order
Markov chain learns in stages: condensation (the loss drops from ``log d`` to the unigram
entropy ``H(pi)``), focus (all queries attend to the most frequent token), redistribution and
dilution (attention spreads again), and symmetry breaking (a new embedding direction).
`solve` integrates the long-context population gradient flow; `train` runs online SGD of the
network on finite contexts from the same initial draw.

```python
import attnflow as af
from attnflow import focus

af.enable_x64()
s = focus.Setup()                   # lazy chain on pi = (0.75, 0.19, 0.05, 0.01), m = mk = 16
th = focus.solve(s, 40.0)           # population gradient flow
sim = focus.train(s, 40.0, key=0)   # online SGD on 256-token contexts, t = dt * step
print(af.compare(th, sim, ["loss", "entropy"]))
```
"""

from .data import CHAIN_TOL as CHAIN_TOL
from .data import SYNTHETIC_PI as SYNTHETIC_PI
from .data import Characters as Characters
from .data import CorpusChain as CorpusChain
from .data import MarkovChain as MarkovChain
from .data import Tokenizer as Tokenizer
from .data import Words as Words
from .data import check_pi as check_pi
from .data import lazy_lam_min as lazy_lam_min
from .data import perturbed_pi as perturbed_pi
from .data import random_windows as random_windows
from .figures import attention_snapshots as attention_snapshots
from .figures import cycle_figure as cycle_figure
from .figures import embedding_pca_figure as embedding_pca_figure
from .figures import rates_figure as rates_figure
from .figures import symmetry_figure as symmetry_figure
from .metrics import RANK_KINDS as RANK_KINDS
from .metrics import condensation as condensation
from .metrics import cosine as cosine
from .metrics import effective_rank as effective_rank
from .metrics import embedding_pca as embedding_pca
from .metrics import kl_to_pi as kl_to_pi
from .metrics import local_attention_rate as local_attention_rate
from .metrics import participation_ratio as participation_ratio
from .metrics import positional_entropy as positional_entropy
from .metrics import redistribution as redistribution
from .metrics import singular_values as singular_values
from .metrics import stage_one_rate as stage_one_rate
from .metrics import stage_sequence as stage_sequence
from .metrics import stage_two_rate as stage_two_rate
from .metrics import token_entropy as token_entropy
from .model import PARAMETERS as PARAMETERS
from .model import OneLayerAttention as OneLayerAttention
from .model import composites as composites
from .model import empirical_attention as empirical_attention
from .model import init_theta as init_theta
from .model import next_token_loss as next_token_loss
from .observe import OBSERVABLES as OBSERVABLES
from .observe import model_observables as model_observables
from .observe import record as record
from .observe import theta_observables as theta_observables
from .sensitivity import ESCAPE_FRACTION as ESCAPE_FRACTION
from .sensitivity import ESCAPE_HORIZON as ESCAPE_HORIZON
from .sensitivity import ESCAPE_MARGIN as ESCAPE_MARGIN
from .sensitivity import ESCAPE_SOLVER as ESCAPE_SOLVER
from .sensitivity import escape_threshold as escape_threshold
from .sensitivity import escape_time as escape_time
from .sensitivity import escape_time_sensitivity as escape_time_sensitivity
from .setup import INIT_SEED as INIT_SEED
from .setup import REFERENCE_LAM as REFERENCE_LAM
from .setup import Setup as Setup
from .theory import DEFAULT_SAVE as DEFAULT_SAVE
from .theory import DEFAULT_SOLVER as DEFAULT_SOLVER
from .theory import DEGENERATE_TOL as DEGENERATE_TOL
from .theory import attention as attention
from .theory import attention_rate as attention_rate
from .theory import attention_rate_lazy as attention_rate_lazy
from .theory import centred_log_pi as centred_log_pi
from .theory import conserved as conserved
from .theory import critical_point_c1 as critical_point_c1
from .theory import degenerate_point as degenerate_point
from .theory import flow_field as flow_field
from .theory import gradient_blocks as gradient_blocks
from .theory import jacobian_blocks as jacobian_blocks
from .theory import ode as ode
from .theory import population_grads as population_grads
from .theory import population_loss as population_loss
from .theory import rank_one_part as rank_one_part
from .theory import reduced_conserved as reduced_conserved
from .theory import reduced_field as reduced_field
from .theory import reduced_from_theta as reduced_from_theta
from .theory import reduced_gradient as reduced_gradient
from .theory import reduced_loss as reduced_loss
from .theory import refine_critical_point as refine_critical_point
from .theory import sigma as sigma
from .theory import solve as solve
from .theory import stage_predictions as stage_predictions
from .theory import theta_from_reduced as theta_from_reduced
from .theory import transverse_rate as transverse_rate
from .train import DEFAULT_BATCH as DEFAULT_BATCH
from .train import DEFAULT_CONTEXT as DEFAULT_CONTEXT
from .train import DEFAULT_DT as DEFAULT_DT
from .train import DEFAULT_TRAIN_SAVE as DEFAULT_TRAIN_SAVE
from .train import MIXING_FRACTION as MIXING_FRACTION
from .train import REFERENCE_T as REFERENCE_T
from .train import TRAIN_TOLERANCE as TRAIN_TOLERANCE
from .train import autocorrelation_time as autocorrelation_time
from .train import train as train

__all__ = [
    "attention_snapshots",
    "cycle_figure",
    "embedding_pca_figure",
    "rates_figure",
    "symmetry_figure",
    "CHAIN_TOL",
    "DEFAULT_BATCH",
    "DEFAULT_CONTEXT",
    "DEFAULT_DT",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEFAULT_TRAIN_SAVE",
    "MIXING_FRACTION",
    "autocorrelation_time",
    "DEGENERATE_TOL",
    "ESCAPE_HORIZON",
    "ESCAPE_FRACTION",
    "ESCAPE_MARGIN",
    "ESCAPE_SOLVER",
    "INIT_SEED",
    "OBSERVABLES",
    "PARAMETERS",
    "REFERENCE_LAM",
    "REFERENCE_T",
    "SYNTHETIC_PI",
    "TRAIN_TOLERANCE",
    "Characters",
    "CorpusChain",
    "MarkovChain",
    "OneLayerAttention",
    "Setup",
    "Tokenizer",
    "Words",
    "attention",
    "attention_rate",
    "attention_rate_lazy",
    "centred_log_pi",
    "composites",
    "condensation",
    "conserved",
    "cosine",
    "critical_point_c1",
    "degenerate_point",
    "RANK_KINDS",
    "effective_rank",
    "embedding_pca",
    "empirical_attention",
    "positional_entropy",
    "escape_threshold",
    "escape_time",
    "escape_time_sensitivity",
    "flow_field",
    "gradient_blocks",
    "init_theta",
    "jacobian_blocks",
    "kl_to_pi",
    "local_attention_rate",
    "model_observables",
    "next_token_loss",
    "participation_ratio",
    "check_pi",
    "lazy_lam_min",
    "perturbed_pi",
    "population_grads",
    "population_loss",
    "random_windows",
    "rank_one_part",
    "record",
    "redistribution",
    "reduced_conserved",
    "reduced_field",
    "reduced_from_theta",
    "reduced_gradient",
    "reduced_loss",
    "refine_critical_point",
    "sigma",
    "singular_values",
    "ode",
    "solve",
    "stage_one_rate",
    "stage_predictions",
    "stage_sequence",
    "stage_two_rate",
    "theta_from_reduced",
    "theta_observables",
    "token_entropy",
    "train",
    "transverse_rate",
]
