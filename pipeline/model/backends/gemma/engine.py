"""The engine a Gemma model spec gets: the one-pass engine for a model tuned by ChatLens (the
default `gemma3-270m`), the prompted engine for any other. What GemmaModelHandler loads."""

from __future__ import annotations

import jax

from pipeline.model.backends.base import ModelOptions
from pipeline.model.decoding.one_pass import OnePassEngine
from pipeline.model.decoding.prompted import EngineConfig, PromptedEngine
from pipeline.model.environment import release_freed_memory
from pipeline.model.loading.quantize import INT8
from pipeline.model.loading.reply_library import ReplyLibraryFile
from pipeline.model.loading.sources import resolve_model
from pipeline.model.types import Engine
from pipeline.prompts import load_prompts

SERVING_DTYPE = "bfloat16"
"""The dtype a tuned model is served in: the one its decoding step reads (`OnePassDecoder`'s
`step_dtype`), so the weights are held once (a float32 model beside its bfloat16 step weights
was 1.5 GiB of the 270M model's 3.4 GiB peak). The prefill, and so the label probabilities, then
runs in it too; by default (`--weights int8`) its weights are keras's int8 (`loading/quantize.py`),
made once under the cache and read as they are (`sources.ModelSource.load`). Both engines load without TensorFlow (`import_keras_hub`) where nothing in the
process imported keras-hub before."""


def load_engine(options: ModelOptions, config: EngineConfig | None = None) -> Engine:
    """The engine for the run's model options: its spec (`model`: 'gemma3-270m', a preset
    directory or handle), `adapter`, `model_cache`, `prompt_variant`, `reply_library` and, for a
    tuned model, `weights` (int8: keras's int8 quantization, `loading/quantize.py`; the engine's
    `model_id` then ends "+int8").

    A model tuned by ChatLens answers in one pass (decoding/one_pass.py). Other models are
    prompted per output (decoding/prompted.py); the prompt variant follows the model's kind
    unless given: few-shot completion prompts for pre-trained models, chat-template prompts
    for instruction-tuned ones.
    """
    source = resolve_model(options.model, options.model_cache, options.adapter)
    config = config or EngineConfig()
    int8 = source.tuned and options.weights == INT8
    causal_lm = source.load(SERVING_DTYPE if source.tuned else "float32", tensorflow=False, int8=int8)
    release_freed_memory()  # what reading and converting the weights freed
    if source.tuned:
        model_id = source.model_id
        if int8:
            forget_loading_programs()
            model_id += f"+{INT8}"  # its outputs differ from the weights as loaded: insights say which
        return OnePassEngine(causal_lm, model_id, max_prompt_tokens=config.max_prompt_tokens,
                             serving=source.serving, reply_library=ReplyLibraryFile(options.reply_library))
    variant = options.prompt_variant or ("chat" if source.instruction_tuned else "completion")
    return PromptedEngine(causal_lm, source.model_id, load_prompts(variant), config)


def forget_loading_programs() -> None:
    """Drop the XLA programs and traces that loading left in jax's caches (the quantizer's, one per
    kernel shape): serving never runs them again (~70 MiB of RSS, measured here)."""
    jax.clear_caches()
    release_freed_memory()
