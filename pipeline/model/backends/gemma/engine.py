"""The engine a Gemma model spec gets: the one-pass engine for a model tuned by ChatLens (the
default `gemma3-270m`), the prompted engine for any other. What GemmaModelHandler loads."""

from __future__ import annotations

from pipeline.model.decoding.one_pass import OnePassEngine
from pipeline.model.decoding.prompted import EngineConfig, PromptedEngine
from pipeline.model.loading.sources import load_causal_lm
from pipeline.model.types import Engine
from pipeline.prompts import load_prompts


def load_engine(spec: str, cache_dir: str | None = None, prompt_variant: str | None = None,
                config: EngineConfig | None = None, adapter: str | None = None) -> Engine:
    """The engine for a model spec ('gemma3-270m', a preset directory or handle, + an adapter).

    A model tuned by ChatLens answers in one pass (decoding/one_pass.py). Other models are
    prompted per output (decoding/prompted.py); the prompt variant follows the model's kind
    unless given: few-shot completion prompts for pre-trained models, chat-template prompts
    for instruction-tuned ones.
    """
    causal_lm, source = load_causal_lm(spec, cache_dir=cache_dir, adapter=adapter)
    config = config or EngineConfig()
    if source.tuned:
        return OnePassEngine(causal_lm, source.model_id, max_prompt_tokens=config.max_prompt_tokens,
                             calibration=source.calibration)
    variant = prompt_variant or ("chat" if source.instruction_tuned else "completion")
    return PromptedEngine(causal_lm, source.model_id, load_prompts(variant), config)
