"""attnflow: training dynamics of attention in JAX.

Theory (order-parameter and reduced ODEs) and simulation (SGD / gradient flow of the
same networks) return the same `Trajectory` of named observables.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("attnflow")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

from .ode import DivergenceError, MaxStepsError, enable_x64, integrate, save_times
from .trajectory import Trajectory, compare

__all__ = [
    "DivergenceError",
    "MaxStepsError",
    "Trajectory",
    "compare",
    "enable_x64",
    "integrate",
    "save_times",
]
