"""`--model-stage remote`: OpenAIChatModelHandler, an OpenAI-compatible endpoint (handler.py here).

The workers only send requests; a model server (vLLM, llama.cpp, Ollama, ...) answers. The
API key, if any, is read on the workers from CHATLENS_REMOTE_API_KEY, never passed as an option.
"""

from __future__ import annotations

from pipeline.model.backends.base import Backend, Option
from pipeline.model.types import Task

OPTIONS: tuple[Option, ...] = (
    Option("--remote-url", "--model-stage remote: base URL of an OpenAI-compatible API, e.g. "
           "http://vllm:8000/v1 (the API key, if any, is read on the workers from CHATLENS_REMOTE_API_KEY)",
           metavar="URL"),
    Option("--remote-model", "--model-stage remote: the model name the endpoint serves, e.g. "
           "google/gemma-3-4b-it", metavar="NAME"),
)


class RemoteBackend(Backend):
    name = "remote"
    listed = 10
    help = "an OpenAI-compatible endpoint (--remote-url, --remote-model)"
    options = OPTIONS
    tasks = (Task.ANALYZE,)

    def check(self, settings) -> None:
        if not (settings.options.get("remote_url") and settings.options.get("remote_model")):
            raise ValueError("--model-stage remote needs --remote-url and --remote-model")

    def handler(self, settings, options, task=Task.ANALYZE):
        from pipeline.model.backends.remote.handler import OpenAIChatModelHandler

        self._task(task)
        return OpenAIChatModelHandler(settings.options["remote_url"], settings.options["remote_model"],
                                      reply_for=options.reply_for, min_batch_size=options.min_batch_size,
                                      max_batch_size=options.max_batch_size)


BACKEND = RemoteBackend()
