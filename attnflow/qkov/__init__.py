"""attnflow.qkov: faster query-key learning sharpens attention (Vashisht & Ramaswamy, ICML 2026).

A one-layer attention model whose query-key (QK) and output-value (OV) circuits learn at
rates ``eta_QK`` and ``eta_OV``; on the theory's data model gradient flow reduces to two
scalars, the OV margin ``mu_OV`` and the QK score gap ``mu_QK``, and a faster QK circuit
reaches a given loss with sharper attention.

```python
import attnflow as af
from attnflow import qkov

af.enable_x64()                     # the theory runs in float64
s = qkov.Setup()                    # CACO, m, n, b, M = 5, 50, 4, 4, |C| = 400, eta_QK = 3, eta_OV = 1
th = qkov.solve(s, 3000.0)          # the reduced ODE in time t
sim = qkov.train(s, 3000.0)         # gradient flow of the full 416-token matrices, same clock
```

On real text (HateXplain, SQuAD, subject-verb agreement): loaders (`load_hatexplain`,
`load_squad`, `load_sva`), one-layer attention models (`make_text_model`) and training over
learning-rate ratios and seeds in one compiled call (`ratio_lanes`, `train_text`,
`evaluate_text`).
"""

from .data import COUNTS as COUNTS
from .data import QUERY_MODES as QUERY_MODES
from .data import CodeGenerator as CodeGenerator
from .data import TheoryTask as TheoryTask
from .metrics import CONFIDENCES as CONFIDENCES
from .metrics import DTAP_EDGES as DTAP_EDGES
from .metrics import attention_concentration as attention_concentration
from .metrics import comprehensiveness_sufficiency as comprehensiveness_sufficiency
from .metrics import confident_concentration as confident_concentration
from .metrics import dtap as dtap
from .metrics import relevant_mass as relevant_mass
from .metrics import rollout as rollout
from .metrics import separability as separability
from .model import CACO as CACO
from .model import CAFO as CAFO
from .model import CODE_SCORE_SCALE as CODE_SCORE_SCALE
from .model import CODE_VOCAB as CODE_VOCAB
from .model import FACO as FACO
from .model import FAFO as FAFO
from .model import MODEL_CLASSES as MODEL_CLASSES
from .model import PAPER_EPS as PAPER_EPS
from .model import PARAMETRISATIONS as PARAMETRISATIONS
from .model import EpsIdentity as EpsIdentity
from .model import Init as Init
from .model import QKOVModel as QKOVModel
from .model import TorchDefault as TorchDefault
from .model import Zeros as Zeros
from .model import balance_diagnostic as balance_diagnostic
from .model import balanced_factorise as balanced_factorise
from .model import circuit_labels as circuit_labels
from .model import code_model as code_model
from .model import cross_entropy as cross_entropy
from .model import factor_conserved as factor_conserved
from .model import make_aligned as make_aligned
from .model import make_model as make_model
from .observe import OBSERVABLES as OBSERVABLES
from .observe import OV_READOUTS as OV_READOUTS
from .observe import QK_READOUTS as QK_READOUTS
from .observe import conserved_quantities as conserved_quantities
from .observe import model_observables as model_observables
from .observe import mu_ov_difference as mu_ov_difference
from .observe import mu_ov_projection as mu_ov_projection
from .observe import mu_qk_distinct as mu_qk_distinct
from .observe import mu_qk_from_attention as mu_qk_from_attention
from .observe import mu_qk_gap as mu_qk_gap
from .observe import state_observables as state_observables
from .optimal import INFEASIBLE_TOL as INFEASIBLE_TOL
from .optimal import OptimalRatio as OptimalRatio
from .optimal import capped_rates as capped_rates
from .optimal import default_horizon as default_horizon
from .optimal import fixed_loss_slope as fixed_loss_slope
from .optimal import optimal_ratio as optimal_ratio
from .optimal import pareto_front as pareto_front
from .optimal import ratio_sensitivity as ratio_sensitivity
from .optimal import reach_loss as reach_loss
from .realdata import DATA_FORMATS as DATA_FORMATS
from .realdata import HATEXPLAIN_LABELS as HATEXPLAIN_LABELS
from .realdata import TextRecord as TextRecord
from .realdata import Vocabulary as Vocabulary
from .realdata import describe as describe
from .realdata import load_hatexplain as load_hatexplain
from .realdata import load_squad as load_squad
from .realdata import load_sva as load_sva
from .realdata import official_split as official_split
from .realdata import resolve_data as resolve_data
from .realdata import split_records as split_records
from .realdata import tokenize as tokenize
from .setup import PAPER_HORIZON_TAU as PAPER_HORIZON_TAU
from .setup import PAPER_LOSS_TARGET as PAPER_LOSS_TARGET
from .setup import PAPER_RATIOS as PAPER_RATIOS
from .setup import PAPER_SIZES as PAPER_SIZES
from .setup import REFERENCE_R001 as REFERENCE_R001
from .setup import Setup as Setup
from .setup import paper_setup as paper_setup
from .textmodel import CIRCUIT_GROUPS as CIRCUIT_GROUPS
from .textmodel import SPECIALS as SPECIALS
from .textmodel import TASKS as TASKS
from .textmodel import TextAttention as TextAttention
from .textmodel import TextBatch as TextBatch
from .textmodel import encode_text as encode_text
from .textmodel import make_text_model as make_text_model
from .textmodel import text_circuit_labels as text_circuit_labels
from .textmodel import text_loss as text_loss
from .texttrain import Lanes as Lanes
from .texttrain import TextSchedule as TextSchedule
from .texttrain import evaluate_text as evaluate_text
from .texttrain import mean_ci as mean_ci
from .texttrain import ratio_lanes as ratio_lanes
from .texttrain import ratio_table as ratio_table
from .texttrain import train_text as train_text
from .texttrain import uniform_relevant_mass as uniform_relevant_mass
from .theory import AUTHORS_SAVE as AUTHORS_SAVE
from .theory import DEFAULT_SAVE as DEFAULT_SAVE
from .theory import DEFAULT_SOLVER as DEFAULT_SOLVER
from .theory import alpha as alpha
from .theory import authors_rk4 as authors_rk4
from .theory import effective_rate as effective_rate
from .theory import escape_time as escape_time
from .theory import first_integral as first_integral
from .theory import from_tau as from_tau
from .theory import invariant as invariant
from .theory import large_t_asymptotics as large_t_asymptotics
from .theory import loss as loss
from .theory import loss_to_margin as loss_to_margin
from .theory import ode as ode
from .theory import reduced_field as reduced_field
from .theory import solve as solve
from .theory import state_at_loss as state_at_loss
from .theory import to_tau as to_tau
from .theory import upper_bounds as upper_bounds
from .train import BATCH_SEED_OFFSET as BATCH_SEED_OFFSET
from .train import DEFAULT_TRAIN_SAVE as DEFAULT_TRAIN_SAVE
from .train import EVAL_SAMPLES as EVAL_SAMPLES
from .train import EVAL_SEED as EVAL_SEED
from .train import EVAL_SIZE as EVAL_SIZE
from .train import FINAL_EVAL_SEED as FINAL_EVAL_SEED
from .train import FIXED_ATTENTION_SAVE as FIXED_ATTENTION_SAVE
from .train import FIXED_EVAL_SEED as FIXED_EVAL_SEED
from .train import FLOW_SOLVER as FLOW_SOLVER
from .train import GENERATOR_BATCH as GENERATOR_BATCH
from .train import GENERATOR_OBSERVABLES as GENERATOR_OBSERVABLES
from .train import GENERATOR_SAVE as GENERATOR_SAVE
from .train import REFERENCE_T as REFERENCE_T
from .train import TRAIN_TOLERANCE as TRAIN_TOLERANCE
from .train import fixed_attention_logits as fixed_attention_logits
from .train import linear_ramp as linear_ramp
from .train import train as train
from .train import train_fixed_attention as train_fixed_attention
from .train import train_on_generator as train_on_generator

__all__ = [
    "escape_time",
    "AUTHORS_SAVE",
    "BATCH_SEED_OFFSET",
    "CACO",
    "CAFO",
    "CIRCUIT_GROUPS",
    "CODE_SCORE_SCALE",
    "CODE_VOCAB",
    "CONFIDENCES",
    "DATA_FORMATS",
    "DEFAULT_SAVE",
    "DEFAULT_SOLVER",
    "DEFAULT_TRAIN_SAVE",
    "DTAP_EDGES",
    "EVAL_SAMPLES",
    "EVAL_SEED",
    "EVAL_SIZE",
    "FACO",
    "FAFO",
    "FINAL_EVAL_SEED",
    "FIXED_ATTENTION_SAVE",
    "FIXED_EVAL_SEED",
    "FLOW_SOLVER",
    "GENERATOR_BATCH",
    "GENERATOR_OBSERVABLES",
    "GENERATOR_SAVE",
    "HATEXPLAIN_LABELS",
    "MODEL_CLASSES",
    "OBSERVABLES",
    "OV_READOUTS",
    "QK_READOUTS",
    "PAPER_EPS",
    "PAPER_HORIZON_TAU",
    "PAPER_LOSS_TARGET",
    "PAPER_RATIOS",
    "PAPER_SIZES",
    "PARAMETRISATIONS",
    "COUNTS",
    "QUERY_MODES",
    "REFERENCE_R001",
    "SPECIALS",
    "TASKS",
    "REFERENCE_T",
    "TRAIN_TOLERANCE",
    "CodeGenerator",
    "EpsIdentity",
    "Init",
    "Lanes",
    "INFEASIBLE_TOL",
    "OptimalRatio",
    "QKOVModel",
    "Setup",
    "TextAttention",
    "TextBatch",
    "TextRecord",
    "TextSchedule",
    "TheoryTask",
    "TorchDefault",
    "Vocabulary",
    "Zeros",
    "alpha",
    "attention_concentration",
    "authors_rk4",
    "balance_diagnostic",
    "balanced_factorise",
    "capped_rates",
    "circuit_labels",
    "code_model",
    "comprehensiveness_sufficiency",
    "confident_concentration",
    "conserved_quantities",
    "cross_entropy",
    "default_horizon",
    "describe",
    "dtap",
    "effective_rate",
    "encode_text",
    "evaluate_text",
    "factor_conserved",
    "first_integral",
    "fixed_attention_logits",
    "fixed_loss_slope",
    "from_tau",
    "invariant",
    "large_t_asymptotics",
    "linear_ramp",
    "load_hatexplain",
    "load_squad",
    "load_sva",
    "loss",
    "loss_to_margin",
    "make_aligned",
    "make_model",
    "make_text_model",
    "mean_ci",
    "model_observables",
    "mu_ov_difference",
    "mu_ov_projection",
    "mu_qk_distinct",
    "mu_qk_from_attention",
    "mu_qk_gap",
    "official_split",
    "optimal_ratio",
    "paper_setup",
    "pareto_front",
    "ratio_lanes",
    "ratio_sensitivity",
    "ratio_table",
    "reach_loss",
    "reduced_field",
    "relevant_mass",
    "resolve_data",
    "rollout",
    "separability",
    "ode",
    "solve",
    "split_records",
    "state_at_loss",
    "state_observables",
    "text_circuit_labels",
    "text_loss",
    "to_tau",
    "tokenize",
    "train",
    "train_fixed_attention",
    "train_on_generator",
    "train_text",
    "uniform_relevant_mass",
    "upper_bounds",
]
