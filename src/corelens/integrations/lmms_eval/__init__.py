"""corelens inside lmms-eval (optional extra: `pip install corelens[lmms]`).

Installing corelens registers the model `corelens` through lmms-eval's plugin entry points (group
`lmms_eval.models`, see pyproject.toml), so that

    python -m lmms_eval --model corelens --model_args pretrained=PATH_OR_ID,policy=POLICY.json --tasks TASK

evaluates any checkpoint corelens supports. Model arguments (one policy at most):

- `pretrained` (folder or hub id), `revision`, `device`, `dtype`, `max_new_tokens` (default 8);
- lmms-eval's `qwen2_5_vl` arguments, same names and defaults: `device_map`, `min_pixels`, `max_pixels`,
  `max_num_frames`, `fps`, `system_prompt`; `visual_prep=qwen2_5_vl|corelens` (docs/integrations.md);
- `policy=FILE.json`: any registered policy (`corelens.policies`: `Policy.to_json()`, with its `name`; the
  `policy` of an entry of `corelens hybrid`'s policies.json), an older hybrid policy file
  (`corelens.hybrid-policy/1`, converted with a deprecation warning), an ablation (heads + op) or a SAP
  condition (`{"prior": ..., "layers": ...}`);
- ablation: `heads=SET,k=5%,op=zero|mean|uniform|knockout[,keys=visual|omega][,means=means.npz]`, where SET is
  a heads.csv, an exported head set or its hub id and the top `k` heads are ablated;
- hybrid: `full=SET,keep=10%,sink=128,window=1024`: the top `keep` heads stay full, the rest stream;
- SAP: `prior=noise|complexity|vis_attn|own,layers=1-3[,sap_heads=all][,convention=mass]`.

`python -m corelens.integrations.lmms_eval SAMPLES.jsonl --out DIR` writes a local lmms-eval task (YAML, its
functions and a JSON copy of the samples) for a corelens sample file; `--include_path DIR` makes it visible.
"""

from __future__ import annotations

MODEL = "corelens"


def manifests():
    """Return lmms-eval's model manifest of the corelens model (the entry point of group lmms_eval.models)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return [ModelManifest(model_id=MODEL, simple_class_path="corelens.integrations.lmms_eval.model.Corelens")]
