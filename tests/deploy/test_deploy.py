"""Deployment files agree with the code: docker-compose.yml, the Dockerfiles, the Dataflow Flex
Template, the Kubernetes manifest and the READMEs.

No Docker engine runs here, so what can be checked without one is checked against the real
code: every service's command line is parsed by `cli.main.build_parser()`, the pipeline
options resolved by `PipelineConfig.from_args` and Beam's own `PipelineOptions`, topic and
subscription names compared with `chatlens.config.LAYOUT`, environment variables with the
settings classes, the images' base versions with pyproject.toml and the installed Beam.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from chatlens.config import DEFAULT_PROJECT, LAYOUT, Settings, get_settings, subscription_path, topic_path
from cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = REPO / "docker-compose.yml"
WORKER = DEPLOY / "worker.Dockerfile"
DASHBOARD = DEPLOY / "dashboard.Dockerfile"
LAUNCHER = DEPLOY / "dataflow" / "flex.Dockerfile"
DEPLOY_SH = DEPLOY / "dataflow" / "deploy.sh"
METADATA = DEPLOY / "dataflow" / "metadata.json"
K8S = DEPLOY / "k8s" / "dashboard.yaml"
EMULATOR_HOST = "pubsub:8085"
HEAVY = {"apache-beam", "jax", "jaxlib", "keras", "keras-hub", "tensorflow", "tensorflow-text", "torch"}
# Imported only where installed (fastapi.responses tries orjson, anyio tries sniffio): here they come
# with the dataflow extra of the dev environment, not because the dashboard needs them.
OPTIONAL = {"orjson", "sniffio"}


# ---- a minimal Dockerfile parser -----------------------------------------------------------
KEYWORDS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
            "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form ENTRYPOINT or CMD (an error otherwise)."""
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        keyword, _, args = text.partition(" ")
        assert keyword.isupper() and keyword in KEYWORDS, f"{path.name}:{start}: unknown instruction {keyword!r}"
        instructions.append(Instruction(keyword, " ".join(args.split()) if keyword != "RUN" else args.strip(), start))
    assert not pending, f"{path.name}: ends inside a continued line"
    return instructions


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV":
            for token in shlex.split(instruction.args):
                name, equals, value = token.partition("=")
                assert equals, f"ENV {token!r}: use the NAME=value form"
                env[name] = value
    return env


def last(instructions: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert found, f"no {keyword}"
    return found[-1]


def dockerignore_patterns() -> list[str]:
    path = REPO / ".dockerignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored_by_docker(relative: str) -> bool:
    ignored = False
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.replace("**/", "*/"))
               for prefix in prefixes):
            ignored = not negate
    return ignored


DOCKERFILES = [WORKER, DASHBOARD, LAUNCHER]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_parse_and_copy_only_what_the_build_context_has(path):
    instructions = parse_dockerfile(path)
    assert instructions[0].keyword == "FROM", "FROM comes first"
    assert sum(i.keyword == "FROM" for i in instructions) == 1
    for instruction in instructions:
        if instruction.keyword in ("COPY", "ADD"):
            tokens = [t for t in shlex.split(instruction.args) if not t.startswith("--")]
            for source in tokens[:-1]:
                source = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", source)  # ${ARG:-default} -> default
                assert not source.startswith("$"), source
                assert (REPO / source).exists(), f"{path.name}:{instruction.line}: COPY {source}: not in the repo"
                assert not ignored_by_docker(source.rstrip("/")), f"{source} is excluded by .dockerignore"
        if instruction.keyword in ("ENTRYPOINT", "CMD"):
            instruction.exec_form()  # exec form: signals reach the process (graceful shutdown)


def test_worker_image_matches_the_projects_python_and_beam():
    import apache_beam

    instructions = parse_dockerfile(WORKER)
    match = re.fullmatch(r"apache/beam_python(\d+)\.(\d+)_sdk:(\S+)", instructions[0].args)
    assert match, instructions[0]
    python, beam = f"{match[1]}.{match[2]}", match[3]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(f"{python}.0")
    assert python == re.search(r"(\d+\.\d+)", requires)[1] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert beam == apache_beam.__version__
    assert any(f"apache_beam.__version__ == '{beam}'" in i.args for i in instructions if i.keyword == "RUN")
    assert last(instructions, "ENTRYPOINT").exec_form() == ["/opt/apache/beam/boot"]

    env = dockerfile_env(instructions)
    assert env["CHATLENS_CACHE"] == "/opt/chatlens/cache"
    assert env["CHATLENS_MODEL"] == "/opt/chatlens/preset"
    assert env["KERAS_BACKEND"] == "jax"
    assert (REPO / "prompts").is_dir() and env["CHATLENS_PROMPTS_DIR"] == "/opt/chatlens/src/prompts"
    args = {i.args.split("=")[0] for i in instructions if i.keyword == "ARG"}
    assert {"JAX_ACCELERATOR", "MODEL_PRESET"} <= args
    bake = next(i for i in instructions if i.keyword == "RUN" and "bake_model.py" in i.args)
    assert '--cache "$CHATLENS_CACHE"' in bake.args and '--link "$CHATLENS_MODEL"' in bake.args
    assert instructions.index(bake) < instructions.index(last(instructions, "ENTRYPOINT"))
    install = [i.args for i in instructions if i.keyword == "RUN" and "pip install" in i.args]
    assert any("-c constraints.txt" in run for run in install) and any("-e ." in run for run in install)


def test_dashboard_image_is_small_and_runs_as_a_user():
    instructions = parse_dockerfile(DASHBOARD)
    assert instructions[0].args == "python:3.11-slim"
    user = last(instructions, "USER").args
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric, non-root user"
    assert instructions.index(last(instructions, "USER")) < instructions.index(last(instructions, "ENTRYPOINT"))
    assert "/healthz" in last(instructions, "HEALTHCHECK").args
    assert last(instructions, "ENTRYPOINT").exec_form() == ["chatlens"]
    cmd = last(instructions, "CMD").exec_form()
    args = build_parser().parse_args(cmd)
    assert args.command == "dashboard" and args.host == "0.0.0.0"
    assert last(instructions, "EXPOSE").args == str(args.port)
    runs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    assert "-r dashboard-requirements.txt" in runs and "-c constraints.txt" in runs
    assert "pip install --no-deps -e ." in runs
    assert dockerfile_env(instructions)["CHATLENS_DATABASE_URL"].startswith("sqlite:////data/")


def test_flex_launcher_image():
    instructions = parse_dockerfile(LAUNCHER)
    base = instructions[0].args
    assert base.split(":")[0] == "gcr.io/dataflow-templates-base/python311-template-launcher-base"
    assert "python311" in base and sys.version_info[:2] == (3, 11)
    env = dockerfile_env(instructions)
    workdir = last(instructions, "WORKDIR").args
    assert env["FLEX_TEMPLATE_PYTHON_PY_FILE"] == f"{workdir}/launch.py"
    assert any(i.keyword == "COPY" and i.args == "deploy/dataflow/launch.py ./launch.py" for i in instructions)
    worker_env = dockerfile_env(parse_dockerfile(WORKER))
    # The launcher resolves the pipeline's defaults; they must name the worker image's paths.
    assert env["CHATLENS_MODEL"] == worker_env["CHATLENS_MODEL"]
    assert env["CHATLENS_CACHE"] == worker_env["CHATLENS_CACHE"]
    assert not any(i.keyword in ("ENTRYPOINT", "CMD") for i in instructions), "keep the launcher's entrypoint"


# ---- the dashboard image's dependencies -------------------------------------------------------
def _requirements(path: Path) -> list[Requirement]:
    lines = [line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [Requirement(line) for line in lines if line]


def _closure(requirements: list[Requirement]) -> set[str]:
    """Installed distributions these requirements pull in (markers evaluated here)."""
    seen: set[str] = set()
    todo = [(r.name, set(r.extras)) for r in requirements]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        new = key not in seen
        seen.add(key)
        for raw in dist.requires or []:
            requirement = Requirement(raw)
            marker = requirement.marker
            wanted = marker is None or marker.evaluate({"extra": ""}) or any(
                marker.evaluate({"extra": extra}) for extra in extras)
            if wanted and (new or extras):
                todo.append((requirement.name, set(requirement.extras)))
        extras.clear()
    return seen


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.lru_cache(maxsize=None)
def _distribution_files(name: str) -> frozenset[str]:
    return frozenset(Path(f).as_posix() for f in importlib.metadata.distribution(name).files or [])


def _distribution_of(file: str | None) -> str | None:
    """The installed distribution a module file belongs to (None: stdlib or the project)."""
    if not file:
        return None
    path = Path(file).resolve()
    for site in (Path(p).resolve() for p in sys.path if p.endswith("site-packages")):
        if site in path.parents:
            relative = path.relative_to(site)
            break
    else:
        return None
    top = relative.parts[0].removesuffix(".py")
    candidates = _packages_distributions().get(top, [])
    if len(candidates) > 1:  # a namespace package (google.*): ask each distribution for the file
        candidates = [name for name in candidates if relative.as_posix() in _distribution_files(name)]
    return canonicalize_name(candidates[0]) if candidates else None


def _project_imports(start: list[str]) -> set[str]:
    """Every module imported anywhere (also inside functions) by `start` and the project modules it reaches."""
    project = ("app", "chatlens", "cli", "localpubsub", "pipeline")
    seen, third_party = set(), set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        base = REPO / module.replace(".", "/")
        files = list(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        for file in (f for f in files if f.exists()):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for name in names:
                    if name.split(".")[0] in project:
                        todo.append(name)
                    elif name.split(".")[0] not in sys.stdlib_module_names:
                        third_party.add(name)
    return third_party


def test_dashboard_requirements_cover_what_its_commands_import():
    """dashboard-requirements.txt (+ their dependencies) covers every import of the dashboard's commands."""
    listed = _requirements(DEPLOY / "dashboard-requirements.txt")
    allowed = _closure(listed)
    assert not allowed & HEAVY, f"the dashboard image would install {sorted(allowed & HEAVY)}"
    constraints = {canonicalize_name(Requirement(line).name)
                   for line in (REPO / "constraints.txt").read_text().splitlines() if line.strip()}
    assert {canonicalize_name(r.name) for r in listed} <= constraints, "every package is pinned"

    # What the commands import when they start: `chatlens` builds its parser from every command module.
    probe = ("import sys; before = set(sys.modules); import cli.main; cli.main.build_parser(); "
             "import app.main, app.server, app.subscriber, app.commands.users, localpubsub.admin, "
             "chatlens.simulate; print('\\n'.join(getattr(sys.modules[m], '__file__', None) or '' "
             "for m in set(sys.modules) - before))")
    files = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}).stdout.split()
    needed = {_distribution_of(f) for f in files}
    # ... and what they import later, inside functions (the subscribers, the Pub/Sub clients).
    for name in _project_imports(["app", "cli.main", "localpubsub.admin", "chatlens.simulate"]):
        spec = importlib.util.find_spec(name)
        needed.add(_distribution_of(spec.origin if spec else None))
    needed -= {None, "chatlens", "localpubsub", *OPTIONAL}
    assert needed, "found no imports: the probe is broken"
    assert needed <= allowed, f"the dashboard image lacks {sorted(needed - allowed)}"


# ---- docker-compose.yml ------------------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def service_argv(name: str) -> list[str]:
    """The chatlens command line a compose service runs (its entrypoint or its image's, plus command)."""
    service = compose()["services"][name]
    dockerfile = REPO / service["build"]["dockerfile"]
    entrypoint = service.get("entrypoint") or last(parse_dockerfile(dockerfile), "ENTRYPOINT").exec_form()
    command = service["command"]
    assert isinstance(command, list), f"{name}: give the command as a list"
    assert entrypoint == ["chatlens"], f"{name} must run the chatlens command"
    return command


def service_env(name: str) -> dict[str, str]:
    service = compose()["services"][name]
    image_env = dockerfile_env(parse_dockerfile(REPO / service["build"]["dockerfile"]))
    return {**image_env, **{k: str(v) for k, v in service.get("environment", {}).items()}}


def setting_names(settings_class) -> set[str]:
    prefix = settings_class.model_config.get("env_prefix", "")
    names = set()
    for field_name, field in settings_class.model_fields.items():
        alias = field.validation_alias
        names |= set(getattr(alias, "choices", None) or [alias] if alias else [f"{prefix}{field_name}".upper()])
    return names


@pytest.fixture
def settings_env(monkeypatch):
    """Apply a service's environment to this process, as its container would have it."""
    def apply(env: dict[str, str]):
        for name in [n for n in os.environ if n.startswith("CHATLENS_") or n == "PUBSUB_EMULATOR_HOST"]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
    yield apply
    get_settings.cache_clear()


def test_compose_services_and_images():
    services = compose()["services"]
    assert {"pubsub", "init", "pipeline", "dashboard", "simulator"} <= set(services)
    for name, service in services.items():
        if name == "pubsub":
            continue
        assert service["build"]["context"] == "."
        assert (REPO / service["build"]["dockerfile"]).is_file()
    assert services["pipeline"]["build"]["dockerfile"] == "deploy/worker.Dockerfile"
    for name in ("init", "dashboard", "simulator"):
        assert services[name]["build"]["dockerfile"] == "deploy/dashboard.Dockerfile"
    assert services["init"]["depends_on"]["pubsub"]["condition"] == "service_healthy"
    for name, service in services.items():
        if name not in ("pubsub", "init"):
            assert service["depends_on"]["init"]["condition"] == "service_completed_successfully", name
    # One image per Dockerfile: services building the same Dockerfile share its tag.
    tags: dict[str, set[str]] = {}
    for service in services.values():
        if "build" in service:
            tags.setdefault(service["build"]["dockerfile"], set()).add(service["image"])
    assert all(len(t) == 1 for t in tags.values()), tags
    assert "dashboard-data" in compose()["volumes"]


def test_compose_pubsub_emulator_matches_the_projects_names():
    pubsub = compose()["services"]["pubsub"]
    assert pubsub["image"] == "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"
    command = shlex.split(pubsub["command"])
    assert command[:5] == ["gcloud", "beta", "emulators", "pubsub", "start"]
    assert f"--project={DEFAULT_PROJECT}" in command
    host, port = next(c for c in command if c.startswith("--host-port=")).split("=", 1)[1].split(":")
    assert host == "0.0.0.0" and f"pubsub:{port}" == EMULATOR_HOST
    assert pubsub["healthcheck"]["test"] and "8085" in " ".join(pubsub["healthcheck"]["test"])
    for name, service in compose()["services"].items():
        if name != "pubsub":
            assert service["environment"]["PUBSUB_EMULATOR_HOST"] == EMULATOR_HOST, name
            assert service["environment"]["CHATLENS_PROJECT"] == DEFAULT_PROJECT, name


def test_compose_environment_names_exist():
    from app.settings import DashboardSettings

    known = setting_names(Settings) | setting_names(DashboardSettings) | {"PUBSUB_EMULATOR_HOST", "PYTHONUNBUFFERED"}
    for name, service in compose()["services"].items():
        unknown = set(service.get("environment", {})) - known
        assert not unknown, f"{name}: {sorted(unknown)} is read by nothing"


def test_compose_init_creates_the_layout_on_the_emulator():
    args = build_parser().parse_args(service_argv("init"))
    assert args.command == "pubsub-init"
    assert args.project == DEFAULT_PROJECT and args.emulator_host == EMULATOR_HOST


@pytest.mark.parametrize("service", ["pipeline", "pipeline-messages"])
def test_compose_pipelines_read_and_write_the_layouts_names(service, settings_env):
    from pipeline.options import PipelineConfig

    args = build_parser().parse_args(service_argv(service))
    assert args.command == "pipeline"
    assert args.beam_args == [], "nothing in the command is left over for Beam: a typo would be"
    settings_env(service_env(service))
    config = PipelineConfig.from_args(args)
    assert config.local and config.project == DEFAULT_PROJECT
    expected = LAYOUT.windows_subscription if config.mode == "windows" else LAYOUT.messages_subscription
    assert config.subscription_path == subscription_path(DEFAULT_PROJECT, expected)
    assert config.results_topic_path == topic_path(DEFAULT_PROJECT, LAYOUT.insights_topic)
    assert config.deadletter_topic_path == topic_path(DEFAULT_PROJECT, LAYOUT.deadletter_topic)
    worker_env = dockerfile_env(parse_dockerfile(WORKER))
    assert config.model == worker_env["CHATLENS_MODEL"], "the model baked into the image"
    assert config.model_cache == worker_env["CHATLENS_CACHE"]


def test_compose_dashboard_settings(settings_env):
    from app.settings import DashboardSettings

    service = compose()["services"]["dashboard"]
    args = build_parser().parse_args(service_argv("dashboard"))
    assert args.command == "dashboard" and not args.no_subscribe
    settings_env(service_env("dashboard"))
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = DashboardSettings(**overrides)
    assert settings.host == "0.0.0.0"
    assert settings.project == DEFAULT_PROJECT and settings.pubsub_emulator_host == EMULATOR_HOST
    assert settings.insights_subscription == LAYOUT.insights_subscription
    assert settings.deadletter_subscription == LAYOUT.deadletter_subscription
    published = [p.rsplit(":", 1) for p in service["ports"]]
    assert [container for _, container in published] == [str(settings.port)]
    database = settings.database_url.removeprefix("sqlite:///")
    mounts = [v.split(":")[1] for v in service["volumes"]]
    assert any(database.startswith(mount + "/") for mount in mounts), "the database lives on the volume"


def test_compose_consumes_every_subscription_and_simulates_into_the_layout(settings_env):
    from app.settings import DashboardSettings
    from pipeline.options import PipelineConfig

    consumed = set()
    for service in ("pipeline", "pipeline-messages"):
        settings_env(service_env(service))
        consumed.add(PipelineConfig.from_args(build_parser().parse_args(service_argv(service))).subscription_path)
    settings_env(service_env("dashboard"))
    dashboard = DashboardSettings()
    consumed |= {dashboard.insights_subscription_path(), dashboard.deadletter_subscription_path()}
    assert consumed == {subscription_path(DEFAULT_PROJECT, s) for s in LAYOUT.subscriptions()
                        if s not in LAYOUT.held_subscriptions()}

    args = build_parser().parse_args(service_argv("simulator"))
    assert args.command == "simulate" and args.project == DEFAULT_PROJECT and args.count == 0


# ---- Dataflow --------------------------------------------------------------------------------
def pipeline_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["pipeline"]


def pipeline_options() -> dict[str, argparse.Action]:
    return {a.dest: a for a in pipeline_parser()._actions if a.option_strings and a.dest != "help"}


def launch_module():
    spec = importlib.util.spec_from_file_location("chatlens_flex_launch", DEPLOY / "dataflow" / "launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_metadata_has_every_pipeline_option_and_nothing_else():
    metadata = json.loads(METADATA.read_text(encoding="utf-8"))
    parameters = {p["name"]: p for p in metadata["parameters"]}
    options = pipeline_options()
    assert len(parameters) == len(metadata["parameters"]), "duplicate parameter names"
    assert set(parameters) == set(options), (
        f"missing: {sorted(set(options) - set(parameters))}, unknown: {sorted(set(parameters) - set(options))}")
    for name, parameter in parameters.items():
        assert parameter["label"] and parameter["helpText"] and parameter["isOptional"] is True, name
        action = options[name]
        for regex in parameter.get("regexes", []):
            for value in action.choices or []:
                assert re.fullmatch(regex, value), (name, value)
            if action.default is not None and name != "runner":
                assert re.fullmatch(regex, str(action.default)), (name, action.default)
        if action.choices or action.type in (int, float):
            assert parameter.get("regexes"), f"{name}: give a regex for a {action.type.__name__} / choice"
    assert re.fullmatch(parameters["runner"]["regexes"][0], "DataflowRunner")
    assert re.fullmatch(parameters["project"]["regexes"][0], "my-project-123")


def test_launcher_renames_template_parameters_for_the_command():
    from pipeline.options import PipelineConfig

    launch = launch_module()
    argv = launch.to_chatlens_argv([
        "--project=my-project-123", "--region=europe-west1", "--results_topic=my-insights", "--max_batch_size=16",
        "--reply_for=all", "--timestamp_attribute=", "--temp_location=gs://b/tmp", "--sdk_container_image=IMG",
    ])
    assert argv[:2] == ["-v", "pipeline"]
    args = build_parser().parse_args(argv)
    assert (args.runner, args.results_topic, args.max_batch_size, args.reply_for, args.timestamp_attribute) == (
        "DataflowRunner", "my-insights", 16, "all", None)
    assert args.beam_args == ["--region=europe-west1", "--temp_location=gs://b/tmp", "--sdk_container_image=IMG"]
    assert not PipelineConfig.from_args(args).local
    explicit = launch.to_chatlens_argv(["--runner=DataflowRunner", "--mode", "messages"])
    assert build_parser().parse_args(explicit).mode == "messages" and explicit.count("--runner=DataflowRunner") == 1


def deploy_sh(command: str, **env: str) -> subprocess.CompletedProcess:
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "DRY_RUN": "1",
                   "PROJECT": "my-project-123", "BUCKET": "my-bucket", "TAG": "v1", **env}
    return subprocess.run(["bash", str(DEPLOY_SH), command], capture_output=True, text=True, env=environment,
                          timeout=30)


def dry_run(command: str, **env: str) -> list[list[str]]:
    result = deploy_sh(command, **env)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def flag_value(argv: list[str], flag: str) -> str:
    for i, token in enumerate(argv):
        if token == flag:
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


def beam_settings(beam_args: list[str]) -> dict:
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(beam_args).get_all_options()


WORKER_IMAGE = "us-central1-docker.pkg.dev/my-project-123/chatlens/chatlens-worker:v1"
L4 = "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"


def test_deploy_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(DEPLOY_SH)], capture_output=True).returncode == 0
    assert os.access(DEPLOY_SH, os.X_OK)
    assert deploy_sh("frobnicate").returncode == 2
    missing = deploy_sh("launch", PROJECT="")
    assert missing.returncode != 0 and "PROJECT" in missing.stderr


def test_deploy_build_makes_both_images_and_the_template():
    commands = dry_run("build")
    builds = [c for c in commands if c[:2] == ["docker", "build"]]
    assert [flag_value(c, "-f") for c in builds] == ["deploy/worker.Dockerfile", "deploy/dataflow/flex.Dockerfile"]
    assert "JAX_ACCELERATOR=cuda12" in builds[0] and flag_value(builds[0], "-t") == WORKER_IMAGE
    assert ["docker", "push", WORKER_IMAGE] in commands
    template = next(c for c in commands if c[:4] == ["gcloud", "dataflow", "flex-template", "build"])
    assert flag_value(template, "--metadata-file") == "deploy/dataflow/metadata.json"
    assert flag_value(template, "--sdk-language") == "PYTHON"
    assert "JAX_ACCELERATOR=cpu" in dry_run("build", GPU="none")[1]


def test_deploy_launch_runs_the_template_on_gpu_workers_with_streaming_engine(settings_env):
    from pipeline.options import PipelineConfig

    [command] = dry_run("launch")
    assert command[:4] == ["gcloud", "dataflow", "flex-template", "run"] and command[4] == "chatlens-windows"
    assert "--enable-streaming-engine" in command and "--update" not in command
    assert flag_value(command, "--worker-machine-type") == "g2-standard-4"
    assert flag_value(command, "--max-workers") == "4"
    parameters = flag_value(command, "--parameters")
    assert parameters.startswith("^~^")
    # What the Flex Template launcher then runs: launch.py with every parameter as --name=value.
    argv = launch_module().to_chatlens_argv(["--" + p for p in parameters[3:].split("~")])
    args = build_parser().parse_args(argv)
    settings_env({})
    config = PipelineConfig.from_args(args)
    worker_env = dockerfile_env(parse_dockerfile(WORKER))
    assert (config.mode, config.model, config.model_cache) == (
        "windows", worker_env["CHATLENS_MODEL"], worker_env["CHATLENS_CACHE"])
    beam = beam_settings(args.beam_args)
    assert beam["sdk_container_image"] == WORKER_IMAGE and beam["sdk_location"] == "container"
    assert beam["dataflow_service_options"] == [L4]
    assert beam["autoscaling_algorithm"] == "THROUGHPUT_BASED" and beam["disk_size_gb"] == 50


def test_deploy_update_and_drain_keep_the_job_name():
    [launch] = dry_run("launch", MODE="messages")
    [update] = dry_run("update", MODE="messages", TRANSFORM_NAME_MAPPINGS='{"Old":"New"}')
    assert update[4] == launch[4] == "chatlens-messages"
    assert "--update" in update and flag_value(update, "--transform-name-mappings") == '{"Old":"New"}'
    assert update[: update.index("--update")] == launch
    [drain] = dry_run("drain", MODE="messages", JOB_ID="2026-11-21_01_02_03-123")
    assert drain[:5] == ["gcloud", "dataflow", "jobs", "drain", "2026-11-21_01_02_03-123"]
    assert flag_value(drain, "--region") == "us-central1"


def test_deploy_submit_passes_real_beam_options(settings_env):
    from apache_beam.options.pipeline_options import StandardOptions

    from pipeline.options import PipelineConfig, beam_options

    [command] = dry_run("submit", UPDATE="1", TRANSFORM_NAME_MAPPINGS='{"Old":"New"}')
    assert command[:2] == ["chatlens", "pipeline"]
    args = build_parser().parse_args(command[1:])
    settings_env({})
    config = PipelineConfig.from_args(args)
    assert config.runner == "DataflowRunner" and not config.local
    assert {"--enable_streaming_engine", "--autoscaling_algorithm=THROUGHPUT_BASED"} <= set(args.beam_args)
    beam = beam_settings(args.beam_args)
    assert beam["enable_streaming_engine"] is True and beam["max_num_workers"] == 4
    assert beam["machine_type"] == "g2-standard-4" and beam["dataflow_service_options"] == [L4]
    assert beam["sdk_container_image"] == WORKER_IMAGE and beam["job_name"] == "chatlens-windows"
    assert beam["update"] is True and beam["transform_name_mapping"] == {"Old": "New"}
    options = beam_options(config, args.beam_args, streaming=True)
    assert options.view_as(StandardOptions).runner == "DataflowRunner" and options.view_as(StandardOptions).streaming


# ---- Flink -------------------------------------------------------------------------------------
def shell_commands(markdown: Path, program: str) -> list[list[str]]:
    """The `program ...` command lines of a Markdown file's ```bash blocks (continuations joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown.read_text(encoding="utf-8"), re.DOTALL):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(program + " "):
                commands.append(shlex.split(line))
    return commands


def test_flink_readme_command_parses():
    readme = DEPLOY / "flink" / "README.md"
    flink = [c for c in shell_commands(readme, "chatlens") if "FlinkRunner" in c]
    assert flink, "no chatlens pipeline --runner FlinkRunner command"
    for command in flink:
        args = build_parser().parse_args(command[1:])
        assert args.command == "pipeline" and args.runner == "FlinkRunner"
        beam = beam_settings(args.beam_args)
        assert beam["flink_master"] and beam["environment_type"] in ("DOCKER", "EXTERNAL")
        assert beam["environment_config"]
    assert any(beam_settings(build_parser().parse_args(c[1:]).beam_args)["environment_type"] == "DOCKER"
               for c in flink)


# ---- Kubernetes -------------------------------------------------------------------------------
def k8s_documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(K8S.read_text(encoding="utf-8")) if d]


def test_k8s_manifest_parses_and_the_dashboard_env_exists_in_its_settings():
    from app.settings import DashboardSettings

    documents = k8s_documents()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert {("Deployment", "chatlens-dashboard"), ("Service", "chatlens-dashboard"),
            ("StatefulSet", "chatlens-postgres"), ("Service", "chatlens-postgres")} <= kinds
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    names = [e["name"] for e in container["env"]]
    assert set(names) <= setting_names(DashboardSettings), sorted(set(names) - setting_names(DashboardSettings))
    env = {e["name"]: e for e in container["env"]}
    assert env["CHATLENS_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "chatlens-dashboard",
                                                                         "key": "database-url"}
    assert env["CHATLENS_INSIGHTS_SUBSCRIPTION"]["value"] == LAYOUT.insights_subscription
    assert env["CHATLENS_DEADLETTER_SUBSCRIPTION"]["value"] == LAYOUT.deadletter_subscription
    assert "PUBSUB_EMULATOR_HOST" not in env, "production reads real Pub/Sub"

    args = build_parser().parse_args(container["args"])
    assert args.command == "dashboard" and args.host == "0.0.0.0"
    [port] = container["ports"]
    assert port["containerPort"] == args.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "chatlens-dashboard")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    uid = last(parse_dockerfile(DASHBOARD), "USER").args.split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == uid

    postgres = next(d for d in documents if d["kind"] == "StatefulSet")
    secrets = {(ref["name"], ref["key"]) for c in [container, *postgres["spec"]["template"]["spec"]["containers"]]
               for e in c["env"] if (ref := e.get("valueFrom", {}).get("secretKeyRef"))}
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for name, key in secrets:  # every Secret the manifest reads is created by the README's commands
        assert re.search(rf"kubectl create secret generic {name}\b[^`]*--from-literal={key}=", readme), (name, key)


# ---- the model baked into the worker image -----------------------------------------------------
def bake_module():
    spec = importlib.util.spec_from_file_location("chatlens_bake_model", DEPLOY / "bake_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bake_a_preset_directory(tmp_path):
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "config.json").write_text("{}")
    (preset / "chatlens.json").write_text(json.dumps({"model_id": "my-gemma-it", "instruction_tuned": True}))
    baked = bake_module().bake(tmp_path / "cache", preset, preset=preset)
    assert baked == {"spec": str(preset), "preset": str(preset.resolve()), "model_id": "my-gemma-it",
                     "prompts": "chat"}
    link = tmp_path / "image" / "preset"
    link.mkdir(parents=True)
    (link / "README.md").write_text("placeholder")  # what the Dockerfile copies in without MODEL_PRESET
    assert bake_module().bake(tmp_path / "cache", link, preset=preset)["model_id"] == "my-gemma-it"
    assert link.is_symlink() and link.resolve() == preset.resolve()
    with pytest.raises(ValueError, match="not a keras-hub preset"):
        bake_module().bake(tmp_path / "cache", link, preset=tmp_path)


@pytest.mark.slow
def test_bake_the_bundled_model_reuses_its_conversion(tmp_path, gemma_source):
    cache = Path(gemma_source.preset).parents[1]
    baked = bake_module().bake(cache, tmp_path / "preset")
    assert baked["model_id"] == gemma_source.model_id and baked["prompts"] == "completion"
    assert (tmp_path / "preset").resolve() == Path(gemma_source.preset).resolve()


# ---- the README --------------------------------------------------------------------------------
def test_deploy_readme_says_how_to_run_it():
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for text in ["docker compose up --build", "docker compose exec dashboard chatlens users add",
                 "deploy/dataflow/deploy.sh build", "deploy/dataflow/deploy.sh launch",
                 "deploy/dataflow/deploy.sh update", "deploy/dataflow/deploy.sh drain",
                 "kubectl apply -f deploy/k8s/dashboard.yaml", "flink/README.md",
                 "OpenAIChatModelHandler", "chatlens pubsub-init --project"]:
        assert text in readme, text
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        if "://" not in link:
            assert (DEPLOY / link).resolve().exists(), f"broken link {link}"
    for command in shell_commands(DEPLOY / "README.md", "chatlens"):
        build_parser().parse_args(command[1:])  # every chatlens command shown parses


def test_dataflow_translates_the_streaming_graph_with_deterministic_state_keys(tmp_path):
    """`--runner DataflowRunner --dry_run=True` (the dataflow extra, offline) translates the whole
    streaming graph; the model stage's deadline batching keeps state under typed keys, so Beam
    no longer warns that a stateful step's key coder may not be deterministic."""
    run = subprocess.run(
        [sys.executable, "-m", "cli", "pipeline", "--runner", "DataflowRunner", "--dry_run=True",
         "--project", "chatlens-test", "--region", "europe-west1", "--temp_location", "gs://chatlens-test/tmp",
         "--mode", "messages", "--max-batch-duration-secs", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "submitted to DataflowRunner" in output, output[-3000:]
    assert "may not be deterministic" not in output and "Stateful" not in output, output[-3000:]
