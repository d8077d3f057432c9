"""The corelens model of lmms-eval: any checkpoint corelens loads, answering under an optional policy."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lmms_eval.api.model import lmms
from PIL import Image
from tqdm import tqdm

from corelens.data.paths import inside, safe_name
from corelens.data.sample import Sample
from corelens.errors import CorelensError
from corelens.integrations.lmms_eval.policy import from_args
from corelens.models.loaded import load

_POLICY_ARGS = ("policy", "heads", "k", "op", "keys", "means", "full", "keep", "sink", "window", "prior",
                "layers", "sap_heads", "convention")  # fmt: skip


class Corelens(lmms):
    """`--model corelens --model_args pretrained=PATH_OR_ID[,policy=...|heads=...|full=...|prior=...]`."""

    is_simple = True

    def __init__(
        self,
        pretrained: str,
        revision: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_new_tokens: int = 8,
        batch_size: int = 1,
        **policy: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(policy) - set(_POLICY_ARGS))
        if unknown:
            raise CorelensError(
                f"unknown corelens model argument(s) {unknown}; expected some of {_POLICY_ARGS}"
            )
        if int(batch_size) != 1:
            raise CorelensError("the corelens model answers one request at a time: batch_size=1")
        self.m = load(str(pretrained), revision=revision, device=str(device), dtype=str(dtype))
        self.policy = from_args(self.m, policy)
        self.max_new_tokens = int(max_new_tokens)
        self._images = tempfile.TemporaryDirectory(prefix="corelens-lmms-")

    def generate_until(self, requests) -> list[str]:
        """Answer each request greedily under the policy (new tokens, special tokens dropped)."""
        out = []
        for request in tqdm(requests, desc="corelens", disable=self.rank != 0):
            context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
            doc = self.task_dict[task][split][doc_id]
            # A corelens task keeps the sample id (the noise prior of SAP is seeded by it).
            name = str(doc["id"]) if isinstance(doc, dict) and doc.get("id") else f"{task}/{split}/{doc_id}"
            sample = self._sample(name, task, context, doc_to_visual(doc) or [])
            new = int(gen_kwargs.get("max_new_tokens", self.max_new_tokens))
            text = self.policy.answer(self.m, sample, new)
            for stop in gen_kwargs.get("until") or []:
                if isinstance(stop, str) and stop:
                    text = text.split(stop)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def _sample(self, name: str, task: str, question: str, visuals: list) -> Sample:
        """Return a corelens sample of one request; PIL images are written losslessly (PNG) for `prepare`."""
        paths, sizes = [], []
        for i, visual in enumerate(visuals):
            if isinstance(visual, (str, Path)):
                with Image.open(visual) as im:
                    size = im.size
                path = Path(visual)
            elif isinstance(visual, Image.Image):
                # The sample id names the PNG: a safe name, distinct for distinct ids (corelens.data.paths).
                path = inside(self._images.name, Path(self._images.name) / f"{safe_name(name)}_{i}.png")
                visual.convert("RGB").save(path)
                size = visual.size
            else:
                raise CorelensError(
                    f"{name}: the corelens model takes images (PIL or paths), got {type(visual).__name__}"
                )
            paths.append(path)
            sizes.append(size)
        question = question.replace("<image>", "").strip()
        return Sample(name, task, question, images=tuple(paths), image_sizes=tuple(sizes))

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """Refused by name: corelens scores generated answers, as its own harness does."""
        raise CorelensError(
            "the corelens model answers generation tasks (output_type: generate_until), not loglikelihood ones"
        )

    def generate_until_multi_round(self, requests) -> list[str]:
        """Refused by name: corelens answers one turn per sample, as its own harness does."""
        raise CorelensError("the corelens model answers single-turn generation tasks, not multi-round ones")
