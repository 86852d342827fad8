"""attnflow: training dynamics of attention in JAX.

Theory (order-parameter and reduced ODEs, `integrate`) and simulation (SGD / gradient
flow of the same networks, `simulate`) return the same `Trajectory` of named
observables; `sweep` runs either over a grid in one compiled call.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("attnflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

from . import expect, optim, plot, rng, saddle
from .expect import GaussianBank, gauss_hermite, psd_sqrt
from .ode import DivergenceError, MaxStepsError, UnrolledTsit5, enable_x64, gradient_flow, integrate, save_times
from .optim import label_by_path, per_circuit
from .plot import family, heatmap, overlay, save_figure
from .report import Report
from .rng import unroll_threefry_on_cpu
from .saddle import escape_time, fixed_point, jacobian, spectrum, unstable_subspace
from .simulate import FullBatch, Minibatch, OnlineSGD, save_steps, simulate
from .sweep import SweepResult, sweep, use_cpu_cores
from .trajectory import Trajectory, compare

__all__ = [
    "DivergenceError", "FullBatch", "family", "GaussianBank", "MaxStepsError", "Minibatch", "OnlineSGD", "Report",
    "SweepResult", "Trajectory", "compare", "enable_x64", "escape_time", "expect", "fixed_point",
    "gauss_hermite", "gradient_flow", "heatmap", "integrate", "jacobian", "label_by_path", "optim", "overlay",
    "per_circuit", "plot", "psd_sqrt", "saddle", "save_figure", "save_steps", "save_times",
    "simulate", "spectrum", "sweep", "unstable_subspace", "use_cpu_cores", "UnrolledTsit5", "unroll_threefry_on_cpu", "rng",
]
