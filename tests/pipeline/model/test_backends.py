"""The model stages' options: model sharing, per-tenant models, model watch, remote inference.

Graphs are built with the real Beam SDK and inspected; the preset watch runs against real
directories. The pipelines that run these options end to end are in test_pipeline_e2e.py
and test_pipeline_transforms.py (real Gemma, real Pub/Sub server).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import apache_beam as beam
import pytest
from apache_beam.ml.inference.base import KeyedModelHandler
from apache_beam.options.pipeline_options import PipelineOptions

from chatlens.contracts import parse_window
from pipeline.model.backends.gemma.handler import GemmaModelHandler
from pipeline.model.backends.remote.handler import OpenAIChatModelHandler
from pipeline.model.backends.keyed import DEFAULT_ROUTE, ModelBackend, TenantModelHandler, parse_tenant_models
from pipeline.model.backends.gemma.watch import PresetWatch, preset_of
from pipeline.options import PipelineConfig
from tests.support.pipeline import run_inference_nodes, window_json

PROJECT = "chatlens-test"


def config_from(*argv: str) -> PipelineConfig:
    from pipeline.streaming import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return PipelineConfig.from_args(parser.parse_args(["--project", PROJECT, *argv]))


def run_inference_transforms(config: PipelineConfig) -> list:
    """The RunInference transforms of the streaming graph `config` describes."""
    from pipeline.graph import build

    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True, project=PROJECT))
    build(pipeline, config)
    return [node.transform for node in run_inference_nodes(pipeline)]


def test_model_sharing_follows_the_runner():
    assert not config_from().large_model  # the local runner runs in one process
    assert config_from("--runner", "DataflowRunner").large_model  # one copy per VM for all SDK processes
    assert config_from("--runner", "DataflowRunner", "--model-sharing", "process").large_model is False
    assert config_from("--model-sharing", "machine").large_model
    [analyze] = run_inference_transforms(config_from("--runner", "DataflowRunner"))  # one model stage
    assert analyze._model_handler.share_model_across_processes()
    [analyze] = run_inference_transforms(config_from())
    assert not analyze._model_handler.share_model_across_processes()


def test_tenant_models_parse_and_fail_clearly():
    assert parse_tenant_models(" quickbite=/models/a , telnova=gemma3_instruct_1b,") == (
        ("quickbite", "/models/a"), ("telnova", "gemma3_instruct_1b"))
    assert parse_tenant_models(None) == ()
    for bad, problem in [("quickbite", "not TENANT=MODEL"), ("=x", "not TENANT=MODEL"),
                         ("a=x,a=y", "appears twice")]:
        with pytest.raises(ValueError, match=problem):
            parse_tenant_models(bad)
    with pytest.raises(ValueError, match="not TENANT=MODEL"):
        config_from("--tenant-models", "quickbite")
    with pytest.raises(ValueError, match="cannot be combined"):
        config_from("--tenant-models", "a=/m/a", "--model-watch", "/m/*/config.json")
    with pytest.raises(ValueError, match="needs --model-stage gemma"):
        config_from("--tenant-models", "a=/m/a", "--model-stage", "noop")
    with pytest.raises(ValueError, match="max-models-per-worker"):
        config_from("--tenant-models", "a=/m/a", "--max-models-per-worker", "0")


def test_tenant_models_route_through_keyed_model_mappings():
    config = config_from("--tenant-models", "quickbite=/models/a,telnova=/models/b,skyway=/models/a",
                         "--max-models-per-worker", "2", "--max-batch-size", "4")
    stage = config.model_backend()
    chat = parse_window(window_json("c1", [("customer", "hi")], tenant="quickbite"))
    other = parse_window(window_json("c2", [("customer", "hi")], tenant="northbank"))
    untenanted = parse_window(window_json("c3", [("customer", "hi")]))
    assert [stage.route(c) for c in (chat, other, untenanted)] == ["quickbite", DEFAULT_ROUTE, DEFAULT_ROUTE]

    for transform in run_inference_transforms(config):
        handler = transform._model_handler
        assert isinstance(handler, TenantModelHandler)
        assert handler._max_models_per_worker_hint == 2
        assert handler.batch_elements_kwargs()["max_batch_size"] == 4  # not dropped by Beam
        models = {key: handler._id_to_mh_map[cohort]._model for key, cohort in handler._key_to_id_map.items()}
        assert models == {DEFAULT_ROUTE: "gemma3-270m", "quickbite": "/models/a", "skyway": "/models/a",
                          "telnova": "/models/b"}
        assert handler._key_to_id_map["skyway"] == handler._key_to_id_map["quickbite"]  # one model, one cohort


def test_model_watch_uses_beams_side_input_on_dataflow_and_the_handler_locally():
    pattern = "gs://models/presets/*/config.json"
    dataflow = config_from("--runner", "DataflowRunner", "--model-watch", pattern, "--model-watch-interval-secs", "30")
    [transform] = run_inference_transforms(dataflow)
    assert transform._watch_model_pattern == pattern and transform._kwargs["interval"] == 30
    assert transform._model_handler._unkeyed._watch_pattern is None
    for transform in run_inference_transforms(config_from("--model-watch", pattern)):
        assert transform._watch_model_pattern is None  # the BundleBasedDirectRunner cannot run it
        assert transform._model_handler._unkeyed._watch_pattern == pattern


def test_update_model_path_takes_the_preset_of_a_matched_file():
    handler = GemmaModelHandler("gemma3-270m")
    handler.update_model_path("gs://bucket/presets/v7/config.json")
    assert handler._model == "gs://bucket/presets/v7"
    handler.update_model_path("/models/v8")
    assert handler._model == "/models/v8"
    handler.update_model_path("")  # Beam's "no new model yet"
    assert handler._model == "/models/v8"
    assert preset_of("/m/v1/model.weights.h5") == "/m/v1" and preset_of("/m/v1/") == "/m/v1"


def write_preset(root, name: str) -> str:
    """A directory shaped like a keras-hub preset, written elsewhere and moved in (as the docs say)."""
    staging = root.parent / f"{name}.staging"
    staging.mkdir()
    (staging / "config.json").write_text(json.dumps({"name": name}))
    os.rename(staging, root / name)
    return str(root / name)


def test_preset_watch_finds_the_newest_new_preset(tmp_path):
    root = tmp_path / "presets"
    root.mkdir()
    write_preset(root, "v1")  # there before the job started: the job runs --model, not this
    started = time.time()
    now = [started]
    watch = PresetWatch(str(root / "*" / "config.json"), interval_secs=10, since=started, clock=lambda: now[0])
    assert watch.latest() is None
    v2 = write_preset(root, "v2")
    assert watch.latest() is None  # not looked again yet: at most once per interval
    now[0] += 10
    assert watch.latest() == v2
    time.sleep(0.05)  # a later modification time
    v3 = write_preset(root, "v3")
    now[0] += 10
    assert watch.latest() == v3
    now[0] += 10
    assert watch.latest() == v3  # nothing new: stays
    (root / "v1" / "config.json").write_text("{}")  # an old preset updated in place counts as new
    now[0] += 10
    assert watch.latest() == str(root / "v1")
    missing = PresetWatch(str(tmp_path / "nothing" / "*" / "config.json"), interval_secs=0)
    assert missing.latest() is None


def test_remote_stage_options_build_the_openai_handler():
    with pytest.raises(ValueError, match="needs --remote-url and --remote-model"):
        config_from("--model-stage", "remote")
    config = config_from("--model-stage", "remote", "--remote-url", "http://vllm:8000/v1",
                         "--remote-model", "google/gemma-3-4b-it", "--max-batch-size", "16")
    [transform] = run_inference_transforms(config)
    handler = transform._model_handler
    assert isinstance(handler, KeyedModelHandler) and isinstance(handler._unkeyed, OpenAIChatModelHandler)
    assert handler._unkeyed._reply_for == "negative" and handler._unkeyed._base_url == "http://vllm:8000/v1"
    assert handler.batch_elements_kwargs()["max_batch_size"] == 16
    assert transform._model_tag.endswith("-remote")  # never attaches to a loaded Gemma
    assert ModelBackend(kind="remote", options={"remote_url": "http://x/v1", "remote_model": "m"}).route(
        parse_window(window_json("c1", [("customer", "hi")], tenant="t"))) == DEFAULT_ROUTE


# ---- a backend's options reach the config and its handler without PipelineConfig naming them ----
def test_every_backend_option_is_a_config_field_from_its_row_and_reaches_its_backend():
    import inspect
    from dataclasses import fields

    import pipeline.options
    from pipeline.model.backends import BACKENDS
    from pipeline.options import beam_options, chatlens_options_class

    defaults = {f.name: f.default for f in fields(PipelineConfig)}
    options_source = inspect.getsource(pipeline.options)
    for chosen in BACKENDS.values():
        for row in chosen.options:
            assert defaults[row.dest] == row.default  # a field, its default read from the row
            assert row.dest not in options_source and row.flag not in options_source  # never named there
    config = config_from("--model-stage", "remote", "--remote-url", "http://vllm:8000/v1", "--remote-model", "m",
                         "--model-watch-interval-secs", "45")
    assert (config.remote_url, config.remote_model, config.model_watch_interval_secs) == (
        "http://vllm:8000/v1", "m", 45)
    assert config.model_backend().options == {"remote_url": "http://vllm:8000/v1", "remote_model": "m"}
    carried = beam_options(config).view_as(chatlens_options_class())
    assert (carried.remote_url, carried.model_watch_interval_secs) == ("http://vllm:8000/v1", 45)
    with pytest.raises(ValueError, match="--model-watch-interval-secs must be at least 1"):
        config_from("--model-watch-interval-secs", "0")  # the row's minimum, checked with no code of its own


NEW_BACKEND = '''
import argparse, json

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from pipeline.model.backends import BACKENDS
from pipeline.model.backends.base import Backend, Option


class EchoHandler(ModelHandler):
    def __init__(self, greeting):
        super().__init__()
        self._greeting = greeting

    def load_model(self):
        return self._greeting

    def run_inference(self, batch, model, inference_args=None):
        return [PredictionResult(x, f"{model}, {x}") for x in batch]


class EchoBackend(Backend):
    name = "echo"
    help = "answers every chat with --echo-greeting"
    options = (Option("--echo-greeting", "what it answers (default hello)", "hello"),
               Option("--echo-times", "how often it says it (default 1)", 1, int, minimum=1))

    def handler(self, settings, options, task="analyze"):
        self._task(task)
        return EchoHandler(settings.options["echo_greeting"] * settings.options["echo_times"])


BACKENDS["echo"] = EchoBackend()  # what its line in the registry does (the checkout stays untouched); pipeline.options is imported after it

from pipeline.options import PipelineConfig, beam_options, chatlens_options_class
from pipeline.streaming import add_arguments

parser = argparse.ArgumentParser()
add_arguments(parser)
flag = {action.dest: action for action in parser._actions}["echo_greeting"]
config = PipelineConfig.from_args(parser.parse_args(
    ["--project", "chatlens-test", "--model-stage", "echo", "--echo-greeting", "hi", "--echo-times", "2"]))
keyed = config.model_backend().handler()
[(route, result)] = keyed.run_inference([("*", "there")], keyed.load_model())
try:
    PipelineConfig.from_args(parser.parse_args(["--project", "chatlens-test", "--model-stage", "echo",
                                                "--echo-times", "0"]))
    problem = None
except ValueError as error:
    problem = str(error)
print(json.dumps({
    "flag_default": flag.default, "stage_choices": list({a.dest: a for a in parser._actions}["model_stage"].choices),
    "config": [config.echo_greeting, config.echo_times],
    "default": PipelineConfig(project="chatlens-test").echo_greeting,
    "beam": beam_options(config).view_as(chatlens_options_class()).echo_greeting,
    "answer": [route, result.inference], "problem": problem,
}))
'''


def test_a_new_backends_option_reaches_the_config_beam_and_its_handler(tmp_path):
    """A backend defined outside pipeline/ (in a fresh process, registered before pipeline.options
    is imported): its options are CLI flags, config fields, Beam options, checked against their
    minimum and handed to its handler, while PipelineConfig's code stays as it is."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "echo_backend.py"
    script.write_text(NEW_BACKEND)
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["flag_default"] == "hello" and "echo" in seen["stage_choices"]
    assert seen["config"] == ["hi", 2] and seen["default"] == "hello" and seen["beam"] == "hi"
    assert seen["answer"] == [DEFAULT_ROUTE, "hihi, there"]
    assert seen["problem"] == "--echo-times must be at least 1"


def test_the_registry_lists_every_backend_package_in_its_listed_order():
    """Every package of pipeline/model/backends/ is a backend (its BACKEND, its handler.py) and is
    listed in the explicit registry, BACKENDS."""
    from pathlib import Path

    import pipeline.model.backends as package
    from pipeline.model.backends import BACKENDS

    packages = {p.parent.name for p in Path(package.__file__).parent.glob("*/__init__.py")}
    assert {type(b).__module__.rsplit(".", 1)[1] for b in BACKENDS.values()} == packages
    assert all((Path(package.__file__).parent / name / "handler.py").is_file() for name in packages)
    assert list(BACKENDS) == ["gemma", "remote", "noop"]  # --model-stage's help and the reference keep this order


def test_model_options_are_the_shared_rows_typed_and_checked_once():
    """ModelOptions has one field per shared row (name, default), is built once from the parsed
    command line, and refuses what the rows refuse: the model fields are written once, in the rows."""
    import argparse
    import dataclasses

    from pipeline.model.backends.base import DEFAULT_MODEL, SHARED_OPTIONS, ModelOptions
    from pipeline.options import PipelineConfig, add_pipeline_arguments

    fields = {f.name: f.default for f in dataclasses.fields(ModelOptions)}
    assert list(fields) == [row.dest for row in SHARED_OPTIONS]
    assert fields == {row.dest: DEFAULT_MODEL if row.dest == "model" else row.default for row in SHARED_OPTIONS}
    parser = argparse.ArgumentParser()
    add_pipeline_arguments(parser)
    args = parser.parse_args(["--max-batch-size", "4", "--reply-for", "all"])
    options = ModelOptions.from_values(args)
    assert options == ModelOptions(max_batch_size=4, reply_for="all")
    assert PipelineConfig(project="chatlens-local", max_batch_size=4, reply_for="all").model_options() == options
    for wrong, message in (({"reply_for": "some"}, "--reply-for must be one of"),
                           ({"max_batch_size": 0}, "batch sizes"), ({"model_copies": 0}, "--model-copies")):
        with pytest.raises(ValueError, match=message):
            ModelOptions(**wrong)
    handler = GemmaModelHandler(options, large_model=False)
    assert handler._options is options and handler.batch_elements_kwargs()["max_batch_size"] == 4


def test_help_texts_say_each_default_from_the_row():
    """A row's help ends with its default, added from `default` (never written in the text again);
    or, where the default needs words (--model-sharing's 'auto', --model-stage's from the registry),
    says them once."""
    from pipeline.model.backends import own_options
    from pipeline.options import OPTIONS

    for row in (*OPTIONS, *own_options()):
        assert row.help.count("(default") <= 1, row.flag
        if row.default is not None and not row.help.endswith(f"(default {row.default})"):
            assert row.flag in ("--model-sharing", "--model-stage"), row.flag
