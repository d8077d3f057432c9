"""Where a checkpoint lives: a local folder, or a hub id resolved through `huggingface_hub`.

`--model` takes a folder or `ORG/NAME[@REVISION]`. A folder that exists wins. An id is looked up in the hub
cache first (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, read at call time so that a
test or a user may set them late); only when it is not cached, the hub is reachable and `HF_HUB_OFFLINE` is
not set is it downloaded. The resolved snapshot folder's name is the commit hash, which run manifests record.

Examples:
    >>> from corelens.models.hub import parse_spec
    >>> parse_spec("Qwen/Qwen2.5-VL-7B-Instruct@main")
    ('Qwen/Qwen2.5-VL-7B-Instruct', 'main')
    >>> parse_spec("llava-hf/llava-1.5-7b-hf")
    ('llava-hf/llava-1.5-7b-hf', None)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from corelens.errors import CorelensError

# The files a transformers VLM checkpoint needs: configs, weights, tokenizer and chat template.
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
# A branch or tag name (`main`, `v1.0`, `refs/pr/1`) or a commit sha: components of safe characters joined by
# single `/`, none starting with `.`; `..`, a leading or trailing `/` and a backslash cannot match.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class Resolved:
    """A checkpoint on disk: its folder, and for a hub id the id, the revision asked for and the commit."""

    path: Path
    id: str | None = None
    revision: str | None = None
    commit: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        """Return what a manifest records about the checkpoint."""
        return {"path": str(self.path), "id": self.id, "revision": self.revision, "commit": self.commit}


def parse_spec(spec: str) -> tuple[str, str | None]:
    """Split `ORG/NAME[@REVISION]` into (id, revision or None)."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def check_id(spec: str, repo: str) -> None:
    """Raise CorelensError unless `repo` is a hub id ORG/NAME that huggingface_hub accepts (no `..`, no path)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo.count("/") != 1:
        # One slash exactly: a bare NAME would be looked up under no organisation, more slashes are a path.
        raise CorelensError(f"{spec}: no such folder, and not a hub id of the form ORG/NAME[@REVISION]")
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise CorelensError(f"{spec}: no such folder, and not a valid hub id ({err})") from None


def check_revision(spec: str, revision: str) -> None:
    """Raise CorelensError unless `revision` is a commit sha or a branch or tag name (no `..`, `/`-led path or `\\`).

    huggingface_hub reads a branch name as a file under the repo's `refs/` in the cache, so a revision that
    climbs out of it would load a snapshot from anywhere and record it under the id.
    """
    if (
        len(revision) > 255
        or not _REVISION.fullmatch(revision)
        or ".." in revision
        or revision.endswith(".lock")
    ):
        raise CorelensError(
            f"{spec}: revision {revision!r} is not a commit sha or a branch or tag name "
            "(letters, digits, '.', '_', '-', '/' between names; no '..', no leading '/' or '.', no backslash)"
        )


def cache_dir() -> Path:
    """Return the hub cache folder huggingface_hub would use, from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _fetch(repo: str, revision: str | None, repo_type: str) -> str:
    """Return the command that downloads `repo` into the hub cache.

    Examples:
        >>> _fetch("Qwen/Qwen2.5-VL-7B-Instruct", None, "model")
        '`hf download Qwen/Qwen2.5-VL-7B-Instruct`'
    """
    extra = (f" --revision {revision}" if revision else "") + (
        "" if repo_type == "model" else f" --repo-type {repo_type}"
    )
    return f"`hf download {repo}{extra}`"


def offline() -> bool:
    """Return True when `HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`) forbids downloads."""
    return any(
        os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve(
    spec: str | Path,
    revision: str | None = None,
    *,
    repo_type: str = "model",
    needs: str = "config.json",
    patterns: list[str] | None = None,
) -> Resolved:
    """Return the folder of checkpoint `spec`: a local folder as it is, a hub id from the cache or the hub.

    `repo_type="dataset"` with `needs="headset.json"` resolves a published head set the same way.
    """
    patterns = PATTERNS if patterns is None else patterns
    what = "checkpoint" if repo_type == "model" else "head set"
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / needs).is_file():
            raise CorelensError(f"{path}: not a {what} folder (no {needs})")
        return Resolved(path)
    repo, at = parse_spec(str(spec))
    if revision is not None and at is not None and revision != at:
        raise CorelensError(f"{spec}: revision given twice ({at!r} and {revision!r})")
    revision = revision or at
    check_id(str(spec), repo)
    if revision is not None:
        check_revision(str(spec), revision)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    cache = cache_dir()
    try:
        folder = snapshot_download(
            repo,
            revision=revision,
            repo_type=repo_type,
            cache_dir=cache,
            local_files_only=True,
            allow_patterns=patterns,
        )
    except IncompleteSnapshotError as err:
        if offline():
            raise CorelensError(f"{repo}: {str(err).splitlines()[0]}") from None
        folder = None
    except LocalEntryNotFoundError:
        folder = None
    if folder is None:
        if offline():
            raise CorelensError(
                f"{repo}{'@' + revision if revision else ''}: not in the hub cache {cache} "
                f"(HF_HUB_OFFLINE is set, so nothing is downloaded); download it first: {_fetch(repo, revision, repo_type)}"
            ) from None
        try:
            folder = snapshot_download(
                repo, revision=revision, repo_type=repo_type, cache_dir=cache, allow_patterns=patterns
            )
        except (HfHubHTTPError, RepositoryNotFoundError, LocalEntryNotFoundError, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CorelensError(
                f"{repo}{'@' + revision if revision else ''}: not in the hub cache {cache}, "
                f"and the download failed: {first}; download it where the hub is reachable "
                f"({_fetch(repo, revision, repo_type)}, then copy the cache) or give a local folder"
            ) from None
    folder = Path(folder)
    if cache.resolve() not in folder.resolve().parents:
        # A last guard: whatever the id and revision, the checkpoint read is one of the cache's snapshots.
        raise CorelensError(f"{repo}: the snapshot {folder} lies outside the hub cache {cache}")
    if not (folder / needs).is_file():
        raise CorelensError(f"{repo}: the cached snapshot {folder} has no {needs}")
    return Resolved(folder, repo, revision, folder.name)
