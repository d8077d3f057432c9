"""The values command-line options choose from, and their defaults, in a module that imports no library.

The registered names (policies, head scores, hybrid kernels, SAP priors) are read from the source of the
folders that register them (`corelens.registered`), so a new registered file is a choice with no line here.
The modules that act on them import them from here (and keep their names: `corelens.attention.interventions.OPS`
is this `OPS`), so that a command's parser lists its choices without importing torch, transformers, numpy
or pandas: `corelens ablate --help` and an argument error answer in well under a second
(benchmarks/cli_startup.py; tests/test_cli_startup.py checks that parsing imports neither torch nor transformers).
"""

from __future__ import annotations

from corelens.registered import names

# The most draws, bootstrap resamples or seeds a count option takes (--n-boot, --draws, --seeds, --max-draws,
# --pairs): Monte Carlo error shrinks as 1/sqrt(n), 0.3 % at this bound; above it a typo (1e12) would ask for
# terabytes before the first sample.
MAX_COUNT = 100_000
# attention.interventions: the ablation operators (every registered policy on a set of heads: `HeadsPolicy`)
# and the knockout key sets (docs/methods.md#interventions).
OPS = names("policy", base="HeadsPolicy")
KEY_SETS = ("visual", "omega")
# policies.graded_budget: which prompt keys a graded head keeps (`corelens frontier --graded`).
GRADED_SELECTS = ("sink+window", "top")
# The fields of a head policy a sweep fills from each head set (so `--policy` leaves them out); the rest of its
# fields are its parameters.
HEADS_FILLED = ("heads", "label", "seed", "meta")
# attention.priors: how SAP writes a prior into a row.
CONVENTIONS = ("mass", "logits", "mean_logits")
# attention.kernels: the hybrid prefill kernels, and the crossover: below this ideal speed-up
# (docs/methods.md#hybrid) of a layer's head set at its prompt length the partitioned kernel's dispatcher runs
# every head dense (stock sdpa): the hybrid path's merge and second pass would cost more than they save
# (benchmarks/README.md#partitioned-crossover).
KERNELS = ("auto", *names("hybrid kernel"))
# policies: what `corelens hybrid --policy` sweeps (hybrid attention and the registered policies derived from it).
HYBRID_POLICIES = names("policy", base="HybridAttention")
DENSE_BELOW = 1.1
# metrics.kvheads: the units a head table counts, and how a KV head's score gathers its query heads'.
GRANULARITIES = ("query", "kv")
RULES = ("sum", "mean", "max")
DEFAULT_RULE = "sum"
# metrics.headsets: the head sets of an ablation, the pool of the random control, the stable set's bar.
SETS = ("top", "bottom", "random", "layer-matched")
RANDOM_FROM = ("all", "non-top")
OPTIONAL = ("stable",)  # asked for by name only: its size varies with the ranking's uncertainty
STABLE_P = 0.9
# experiments.scorers: the registered head scores of `rank --score`.
HEAD_SCORES = names("head score")
# metrics.answers: how an answer is scored.
SCORERS = ("auto", "exact", "choice", "yesno")
# experiments.hybrid: what a hybrid sweep's `sets` may name.
ADAPTIVE = "adaptive"
HYBRID_SET_KINDS = ("top", "bottom", "random", "layer-matched", "stable", ADAPTIVE)
# experiments.sap: the registered priors (the four above and the control "own"), and the four a SAP sweep
# runs by default, in the paper's order.
PRIOR_NAMES = names("prior")
PRIORS = ("vis_attn", "complexity", "noise", "key")
# experiments.flow: baselines, reference input, positions, alpha and where epsilon_RoPE is taken.
BASELINES = ("none", "noise-delta", "noise-qkv")
REFERENCES = ("module", "layer")
POSITION_SETS = ("all", "visual", "text")
DEFAULT_ALPHA = 16.0  # why 16: docs/methods.md, "Token mixing and ε_RoPE"
ROPE_ON = ("delta", "residual")  # ε_RoPE on attention outputs Δ or residuals X + Δ: docs/methods.md#geometry
