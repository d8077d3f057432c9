"""corelens: find, test and exploit the attention heads of multimodal LLMs that retrieve visual evidence."""

from importlib.metadata import version as _version

__version__ = _version("corelens")  # one source: pyproject.toml, as installed

from corelens.attention.hybrid import hybrid  # noqa: E402
from corelens.attention.interventions import Ablation, ablate  # noqa: E402
from corelens.data import Sample, read_samples  # noqa: E402
from corelens.errors import CorelensError, InputError, OptionError, UnsupportedModelError  # noqa: E402
from corelens.experiments.rank import Ranking, measure_sample, rank  # noqa: E402
from corelens.heads import HeadSet  # noqa: E402
from corelens.models import Loaded, load  # noqa: E402
from corelens.models.prepare import prepare  # noqa: E402

__all__ = [
    "Ablation",
    "CorelensError",
    "HeadSet",
    "InputError",
    "Loaded",
    "OptionError",
    "Ranking",
    "Sample",
    "UnsupportedModelError",
    "ablate",
    "hybrid",
    "load",
    "measure_sample",
    "prepare",
    "rank",
    "read_samples",
]
