"""The corelens model of lmms-eval: any checkpoint corelens loads, answering under an optional policy.

Its arguments and their defaults are those of lmms-eval's own `qwen2_5_vl` model (`device_map`,
`min_pixels`, `max_pixels`, `max_num_frames`, `fps`, `system_prompt`), and it exposes `device`, `rank`,
`world_size` and `accelerator` as lmms-eval's models do, so `accelerate launch` and `torchrun` with several
processes give each process its share of the requests.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import torch
from lmms_eval.api.model import lmms
from loguru import logger
from PIL import Image
from tqdm import tqdm

from corelens.data.paths import inside, safe_name
from corelens.data.sample import Sample, Video
from corelens.errors import CorelensError, OptionError
from corelens.integrations.lmms_eval.policy import answer_sample, policy_of
from corelens.models.loaded import load, no_checkpoint_code

_POLICY_ARGS = ("policy", "heads", "k", "op", "keys", "means", "full", "keep", "sink", "window", "prior",
                "layers", "sap_heads", "convention")  # fmt: skip

# lmms-eval's qwen2_5_vl defaults (models/simple/qwen2_5_vl.py), taken over with their names.
MIN_PIXELS = 256 * 28 * 28
MAX_PIXELS = 1605632
MAX_NUM_FRAMES = 32
SYSTEM_PROMPT = "You are a helpful assistant."
VIDEO_FPS = 2.0  # the sampling rate qwen2_5_vl's video reader uses when `fps` is not given
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")
# Generation settings a task may give, each honoured as qwen2_5_vl reads it; any other is refused by name.
GEN_KWARGS = ("max_new_tokens", "temperature", "top_p", "num_beams", "do_sample", "until")
# Families whose processor takes min_pixels / max_pixels (the Qwen-VL image and video processors).
PIXEL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


VISUAL_PREP = ("qwen2_5_vl", "corelens")


def as_qwen2_5_vl_sees(image: Image.Image, min_pixels: int, max_pixels: int, factor: int) -> Image.Image:
    """Return a PIL image as qwen2_5_vl hands it to the processor: a JPEG of quality 85 (its data URL), resized
    by qwen-vl-utils (PIL's bicubic) to the nearest multiple of `factor` within the pixel bounds."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=85)
    with Image.open(buffer) as decoded:
        decoded = decoded.convert("RGB")
    height, width = smart_resize(decoded.height, decoded.width, factor, min_pixels, max_pixels)
    return decoded.resize((width, height), Image.Resampling.BICUBIC)


class _WithSystem:
    """A processor whose chat template puts `system` first, as qwen2_5_vl's messages do; all else passes."""

    def __init__(self, processor: Any, system: str) -> None:
        self._processor, self._system = processor, system

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any:
        return self._processor.apply_chat_template(
            [{"role": "system", "content": self._system}, *conversation], **kwargs
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._processor(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)


def greedy_tokens(gen_kwargs: dict, default: int, where: str) -> tuple[int, list[str]]:
    """Return (max_new_tokens, stop strings) of a request's generation settings, as qwen2_5_vl reads them.

    The corelens policies answer greedily: a temperature above 0 (qwen2_5_vl's switch to sampling) or a beam
    search is refused by name, as is any setting outside `GEN_KWARGS`; nothing is dropped silently.
    """
    unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if unknown:
        raise OptionError(f"{where}: generation setting(s) {unknown} are not supported by the corelens "
                          f"model (it honours {', '.join(GEN_KWARGS)})")  # fmt: skip
    # qwen2_5_vl samples exactly when temperature > 0 (it overrides do_sample by the temperature); top_p
    # only acts while sampling.
    temperature = float(gen_kwargs.get("temperature") or 0)
    if temperature > 0:
        raise OptionError(f"{where}: temperature={temperature:g} asks for sampling; the corelens model answers "
                          "greedily (give temperature: 0, or --gen_kwargs temperature=0)")  # fmt: skip
    beams = int(gen_kwargs.get("num_beams") or 1)
    if beams != 1:
        raise OptionError(f"{where}: num_beams={beams}: the corelens model answers greedily (num_beams: 1)")
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    # As qwen2_5_vl: "\n\n" is never a stop string (it would cut multi-paragraph answers).
    stops = [s for s in until if isinstance(s, str) and s and s != "\n\n"]
    return int(gen_kwargs.get("max_new_tokens") or default), stops


class Corelens(lmms):
    """`--model corelens --model_args pretrained=PATH_OR_ID[,policy=...|heads=...|full=...|prior=...]`."""

    is_simple = True

    def __init__(
        self,
        pretrained: str,
        revision: str | None = None,
        device: str = "auto",
        device_map: str | None = "auto",
        dtype: str = "auto",
        max_new_tokens: int = 8,
        batch_size: int = 1,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_num_frames: int = MAX_NUM_FRAMES,
        fps: float | None = None,
        system_prompt: str | None = SYSTEM_PROMPT,
        visual_prep: str = "qwen2_5_vl",
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
        from accelerate import Accelerator

        self.accelerator = Accelerator()
        self._rank = self.accelerator.process_index
        self._world_size = self.accelerator.num_processes
        self.m = load(
            str(pretrained), revision=revision, dtype=str(dtype), **self._placement(device, device_map)
        )
        self._device = self.m.device
        self._pixels(min_pixels, max_pixels)
        # An empty system_prompt leaves the system turn out, as corelens' own commands prompt.
        if system_prompt:
            self.m.processor = _WithSystem(self.m.processor, str(system_prompt).replace("\\n", "\n"))
        if visual_prep not in VISUAL_PREP:
            raise OptionError(f"visual_prep={visual_prep}: expected one of {', '.join(VISUAL_PREP)}")
        # qwen2_5_vl's own preparation of PIL images applies to the Qwen-VL families only.
        self.visual_prep = visual_prep if self.m.model_type in PIXEL_FAMILIES else "corelens"
        self.policy = policy_of(self.m, policy)  # a registered policy, or None: the model as it is
        self.max_new_tokens = int(max_new_tokens)
        self.max_num_frames = int(max_num_frames)
        self.fps = float(fps) if fps else None
        self._images = tempfile.TemporaryDirectory(prefix="corelens-lmms-")

    def _placement(self, device: str, device_map: str | None) -> dict:
        """Return load()'s placement: this process's device under several processes, else as qwen2_5_vl."""
        if self._world_size > 1:
            # Data parallel, as qwen2_5_vl: each process holds a whole copy on its own device (cuda:LOCAL_RANK,
            # or the CPU under `accelerate launch --cpu` / gloo) and device_map is not used.
            return {"device": str(self.accelerator.device)}
        if str(device) != "auto" or not device_map or str(device_map).lower() == "none":
            # A device named explicitly (device=cpu, device=cuda:1) places the whole model there.
            return {"device": str(device)}
        return {"device_map": str(device_map)}

    def _pixels(self, min_pixels: int | None, max_pixels: int | None) -> None:
        """Give a Qwen-VL processor qwen2_5_vl's pixel bounds; refuse bounds another family cannot take."""
        if self.m.model_type not in PIXEL_FAMILIES:
            given = {
                k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None
            }
            if given:
                raise OptionError(f"{sorted(given)}: {self.m.model_type} processors take no pixel bounds "
                                  f"(only {', '.join(PIXEL_FAMILIES)})")  # fmt: skip
            return
        from transformers import AutoProcessor

        bounds = {"min_pixels": int(min_pixels or MIN_PIXELS), "max_pixels": int(max_pixels or MAX_PIXELS)}
        with no_checkpoint_code(self.m.path):  # the same call as qwen2_5_vl's, on the resolved folder
            self.m.processor = AutoProcessor.from_pretrained(self.m.path, local_files_only=True, **bounds)
        self.min_pixels, self.max_pixels = bounds["min_pixels"], bounds["max_pixels"]

    def _factor(self) -> int:
        """Return the side in pixels of one merged visual token (patch size x merge size)."""
        image_processor = self.m.processor.image_processor
        return int(image_processor.patch_size) * int(image_processor.merge_size)

    @property
    def device(self) -> torch.device:
        """Return the device the inputs go to (the first layer's under a device map)."""
        return self._device

    @property
    def model(self) -> torch.nn.Module:
        """Return the transformers model."""
        return self.m.model

    def generate_until(self, requests) -> list[str]:
        """Answer each request greedily under the policy (new tokens, special tokens dropped)."""
        out = []
        # Each process answers its own share (lmms-eval splits the documents by rank); said once per process.
        logger.info(
            f"corelens: process {self.rank} of {self.world_size} on {self.device}: {len(requests)} requests"
        )
        for request in tqdm(requests, desc="corelens", disable=self.rank != 0):
            context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
            doc = self.task_dict[task][split][doc_id]
            # A corelens task keeps the sample id (the noise prior of SAP is seeded by it).
            name = str(doc["id"]) if isinstance(doc, dict) and doc.get("id") else f"{task}/{split}/{doc_id}"
            new, stops = greedy_tokens(dict(gen_kwargs or {}), self.max_new_tokens, f"task {task}")
            sample = self._sample(name, task, context, doc_to_visual(doc) or [])
            text = answer_sample(self.m, sample, self.policy, new)
            for stop in stops:
                text = text.split(stop)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def _sample(self, name: str, task: str, question: str, visuals: list) -> Sample:
        """Return a corelens sample of one request; PIL images are written losslessly (PNG) for `prepare`."""
        paths, sizes, video = [], [], None
        for i, visual in enumerate(visuals):
            if isinstance(visual, (str, Path)) and str(visual).lower().endswith(VIDEO_SUFFIXES):
                # A video file: corelens' reader samples it at `fps`, thinned uniformly to max_num_frames.
                if video is not None:
                    raise CorelensError(f"{name}: the corelens model takes one video per request")
                video = Video(None, Path(visual), self.fps or VIDEO_FPS, self.max_num_frames)
                continue
            if isinstance(visual, (str, Path)):
                with Image.open(visual) as im:
                    size = im.size
                path = Path(visual)
            elif isinstance(visual, Image.Image):
                # The sample id names the PNG: a safe name, distinct for distinct ids (corelens.data.paths).
                path = inside(self._images.name, Path(self._images.name) / f"{safe_name(name)}_{i}.png")
                if self.visual_prep == "qwen2_5_vl":
                    visual = as_qwen2_5_vl_sees(visual, self.min_pixels, self.max_pixels, self._factor())
                visual.convert("RGB").save(path)
                size = visual.size
            else:
                raise CorelensError(f"{name}: the corelens model takes images (PIL or paths) and video files "
                                    f"({', '.join(VIDEO_SUFFIXES)}), got {type(visual).__name__}")  # fmt: skip
            paths.append(path)
            sizes.append(size)
        # As qwen2_5_vl: the "<image>" placeholders go, the visuals come first in the user turn.
        question = question.replace("<image>", "")
        return Sample(name, task, question, images=tuple(paths), video=video, image_sizes=tuple(sizes))

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """Refused by name: corelens scores generated answers, as its own harness does."""
        raise CorelensError(
            "the corelens model answers generation tasks (output_type: generate_until), not loglikelihood ones"
        )

    def generate_until_multi_round(self, requests) -> list[str]:
        """Refused by name: corelens answers one turn per sample, as its own harness does."""
        raise CorelensError("the corelens model answers single-turn generation tasks, not multi-round ones")
