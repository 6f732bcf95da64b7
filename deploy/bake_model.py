"""Bake the model into the worker image at build time (deploy/worker.Dockerfile runs this).

Without --preset: converts the GGUF bundled with the project (spec 'gemma3-270m', with
ChatLens's adapter merged in where one is committed) into a keras-hub preset under --cache, exactly where `pipeline.model.loading.sources` looks for it, and
links --link to it. With --preset DIR: checks that DIR is a keras-hub preset directory
(config.json; optional chatlens.json with model_id and instruction_tuned) and links --link
to it. Either way it then resolves --link the way a worker does and fails the build if that
would download or convert anything, so workers start with nothing to fetch or convert.

    python deploy/bake_model.py --cache /opt/chatlens/cache --link /opt/chatlens/preset [--preset DIR] [--prune]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout or from the image's source tree
    sys.path.insert(0, str(REPO))


def bake(cache: Path, link: Path, preset: Path | None = None, prune: bool = False) -> dict[str, str]:
    """Bake the model; returns what a worker will resolve --link to (spec, preset, model_id)."""
    from pipeline.model.environment import use_default_env

    use_default_env()
    from pipeline.model.loading.sources import GGUF_SPEC, resolve_model

    if preset is not None:
        source = resolve_model(str(preset))  # raises ModelSpecError without config.json
        target = Path(source.preset).resolve()
    else:
        source = resolve_model(GGUF_SPEC, cache)  # converts once, into the cache
        again = resolve_model(GGUF_SPEC, cache)
        if again.converted:
            raise SystemExit(f"the preset in {cache} is not reused: workers would convert it again")
        target = Path(source.preset).resolve()
        if prune:  # the assembled GGUF was only the conversion's input
            shutil.rmtree(cache / "gguf", ignore_errors=True)
    if link.resolve() != target:
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)  # the image's placeholder (deploy/models copied in)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    worker_view = resolve_model(str(link))
    if worker_view.kind != "preset_dir" or worker_view.converted:
        raise SystemExit(f"{link} does not resolve to a ready preset directory: {worker_view}")
    return {"spec": str(link), "preset": str(target), "model_id": worker_view.model_id,
            "prompts": "chat" if worker_view.instruction_tuned else "completion"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="CHATLENS_CACHE of the image")
    parser.add_argument("--link", type=Path, required=True, help="path the image's CHATLENS_MODEL names")
    parser.add_argument("--preset", type=Path, help="a keras-hub preset directory to bake instead")
    parser.add_argument("--prune", action="store_true", help="delete the assembled GGUF after converting")
    args = parser.parse_args(argv)
    baked = bake(args.cache, args.link, args.preset, args.prune)
    print(" ".join(f"{key}={value}" for key, value in baked.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
