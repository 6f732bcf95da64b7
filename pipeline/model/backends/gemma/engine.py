"""The engine a Gemma model spec gets: the one-pass engine for a model tuned by ChatLens (the
default `gemma3-270m`), the prompted engine for any other. What GemmaModelHandler loads."""

from __future__ import annotations

from pipeline.model.backends.base import ModelOptions
from pipeline.model.decoding.one_pass import OnePassEngine
from pipeline.model.decoding.prompted import EngineConfig, PromptedEngine
from pipeline.model.loading.reply_library import ReplyLibraryFile
from pipeline.model.loading.sources import load_causal_lm
from pipeline.model.types import Engine
from pipeline.prompts import load_prompts


def load_engine(options: ModelOptions, config: EngineConfig | None = None) -> Engine:
    """The engine for the run's model options: its spec (`model`: 'gemma3-270m', a preset
    directory or handle), `adapter`, `model_cache`, `prompt_variant` and `reply_library`.

    A model tuned by ChatLens answers in one pass (decoding/one_pass.py). Other models are
    prompted per output (decoding/prompted.py); the prompt variant follows the model's kind
    unless given: few-shot completion prompts for pre-trained models, chat-template prompts
    for instruction-tuned ones.
    """
    causal_lm, source = load_causal_lm(options.model, cache_dir=options.model_cache, adapter=options.adapter)
    config = config or EngineConfig()
    if source.tuned:
        return OnePassEngine(causal_lm, source.model_id, max_prompt_tokens=config.max_prompt_tokens,
                             serving=source.serving, reply_library=ReplyLibraryFile(options.reply_library))
    variant = options.prompt_variant or ("chat" if source.instruction_tuned else "completion")
    return PromptedEngine(causal_lm, source.model_id, load_prompts(variant), config)
