"""attnflow: training dynamics of attention in JAX.

Theory (order-parameter and reduced ODEs, `integrate`) and simulation (SGD / gradient
flow of the same networks, `simulate`) return the same `Trajectory` of named
observables; `sweep` runs either over a grid in one compiled call. Each theory package
(`deeplinear`, `qkov`, `focus`, `heads`, `derive`) has the same shape: ``Setup``, ``solve``,
``train`` and ``OBSERVABLES`` (see `attnflow.setup`).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("attnflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

from . import analysis as analysis
from . import expect as expect
from . import optim as optim
from . import plot as plot
from . import rng as rng
from . import saddle as saddle
from ._io import data_path as data_path
from .analysis import detect_plateaus as detect_plateaus
from .analysis import event_time as event_time
from .analysis import first_crossing as first_crossing
from .analysis import fit_line as fit_line
from .analysis import fit_power_law as fit_power_law
from .analysis import growth_rate as growth_rate
from .analysis import value_at as value_at
from .cache import clear_compilation_cache as clear_compilation_cache
from .cache import use_compilation_cache as use_compilation_cache
from .compilation import CompileCount as CompileCount
from .compilation import count_compilations as count_compilations
from .expect import GaussianBank as GaussianBank
from .expect import gauss_hermite as gauss_hermite
from .expect import psd_sqrt as psd_sqrt
from .finite_size import FiniteSizeFit as FiniteSizeFit
from .finite_size import fit_finite_size as fit_finite_size
from .finite_size import trajectory_gap as trajectory_gap
from .ode import ODE as ODE
from .ode import RK4 as RK4
from .ode import DivergenceError as DivergenceError
from .ode import MaxStepsError as MaxStepsError
from .ode import ObservableEvent as ObservableEvent
from .ode import UnrolledTsit5 as UnrolledTsit5
from .ode import as_data as as_data
from .ode import crossing_time as crossing_time
from .ode import enable_x64 as enable_x64
from .ode import gradient_flow as gradient_flow
from .ode import integrate as integrate
from .optim import label_by_path as label_by_path
from .optim import per_circuit as per_circuit
from .optim import weighted_balance as weighted_balance
from .options import LinearGrid as LinearGrid
from .options import LogGrid as LogGrid
from .options import SaveGrid as SaveGrid
from .options import SolverOptions as SolverOptions
from .options import TimeGrid as TimeGrid
from .plot import family as family
from .plot import heatmap as heatmap
from .plot import overlay as overlay
from .plot import save_figure as save_figure
from .prior import Prior as Prior
from .report import Report as Report
from .saddle import FixedPointBranch as FixedPointBranch
from .saddle import Spectrum as Spectrum
from .saddle import escape_time as escape_time
from .saddle import fixed_point as fixed_point
from .saddle import fixed_point_branch as fixed_point_branch
from .saddle import jacobian as jacobian
from .saddle import spectrum as spectrum
from .saddle import unstable_subspace as unstable_subspace
from .sensitivity import Sensitivity as Sensitivity
from .sensitivity import central_difference as central_difference
from .sensitivity import sensitivity as sensitivity
from .sensitivity import solver_for_mode as solver_for_mode
from .setup import AbstractSetup as AbstractSetup
from .simulate import FullBatch as FullBatch
from .simulate import Minibatch as Minibatch
from .simulate import OnlineSGD as OnlineSGD
from .simulate import TrainingMode as TrainingMode
from .simulate import check_divergence as check_divergence
from .simulate import simulate as simulate
from .stiff import AutoStiff as AutoStiff
from .stiff import KrylovW as KrylovW
from .sweep import Shard as Shard
from .sweep import ShardPending as ShardPending
from .sweep import Static as Static
from .sweep import SweepError as SweepError
from .sweep import SweepResult as SweepResult
from .sweep import process_shard as process_shard
from .sweep import sweep as sweep
from .sweep import sweep_defaults as sweep_defaults
from .sweep import use_cpu_cores as use_cpu_cores
from .trajectory import Trajectory as Trajectory
from .trajectory import compare as compare

__all__ = [
    "AbstractSetup",
    "AutoStiff",
    "CompileCount",
    "KrylovW",
    "DivergenceError",
    "FiniteSizeFit",
    "FullBatch",
    "GaussianBank",
    "LinearGrid",
    "LogGrid",
    "MaxStepsError",
    "ODE",
    "Minibatch",
    "OnlineSGD",
    "Prior",
    "Report",
    "SaveGrid",
    "Sensitivity",
    "Shard",
    "Static",
    "ShardPending",
    "SolverOptions",
    "SweepError",
    "SweepResult",
    "TimeGrid",
    "Trajectory",
    "TrainingMode",
    "RK4",
    "UnrolledTsit5",
    "analysis",
    "as_data",
    "crossing_time",
    "central_difference",
    "check_divergence",
    "clear_compilation_cache",
    "compare",
    "count_compilations",
    "data_path",
    "detect_plateaus",
    "enable_x64",
    "escape_time",
    "expect",
    "family",
    "event_time",
    "first_crossing",
    "fit_finite_size",
    "fit_line",
    "fit_power_law",
    "fixed_point",
    "fixed_point_branch",
    "FixedPointBranch",
    "gauss_hermite",
    "gradient_flow",
    "growth_rate",
    "heatmap",
    "integrate",
    "ObservableEvent",
    "jacobian",
    "label_by_path",
    "optim",
    "overlay",
    "per_circuit",
    "weighted_balance",
    "plot",
    "process_shard",
    "psd_sqrt",
    "rng",
    "saddle",
    "save_figure",
    "sensitivity",
    "solver_for_mode",
    "simulate",
    "spectrum",
    "Spectrum",
    "sweep",
    "sweep_defaults",
    "trajectory_gap",
    "unstable_subspace",
    "use_compilation_cache",
    "use_cpu_cores",
    "value_at",
]
