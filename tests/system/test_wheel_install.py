"""A non-editable install works: the wheel built from this checkout, installed in a fresh
virtualenv, runs `chatlens analyze` and `chatlens dashboard` with no checkout in sight.

Installing the dependencies again (JAX, TensorFlow, Beam: gigabytes, minutes) is left out: the
fresh venv borrows this environment's. One line in a .pth file of its site-packages names this
environment's site-packages; a plain path line puts that directory on sys.path but runs none of
the .pth files in it, so the editable install's finder (and with it the checkout) stays out.
The wheel goes in before that line is written, so pip never sees the editable install. Every
command runs with a temp dir as its working directory, and the test checks where each package and
each file it reads came from: prompts, corpus, adapter, templates and static files are package
data of the installed wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.support.app import PASSWORD, dashboard_process, free_port, sqlite_url
from tests.support.models import tiny_gemma_lm

from chatlens.config import DEFAULT_PROJECT
from chatlens.contracts import ChatInsight, DeadLetter

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "chatlens", "cli", "pipeline")
# What a build never reads: left out of the copy the wheel is built from (the repository itself
# gets no build/ or *.egg-info from this test).
NOT_COPIED = {".git", ".venv", "tests", "docs", "bench", "deploy", ".ci", "shared", "build", "dist",
              "__pycache__", ".pytest_cache", "node_modules"}
# Package data: the folders of the checkout whose every file the wheel holds, and where.
SHIPPED = {"app/templates": "app/templates", "app/static": "app/static", "chatlens/json_schemas":
           "chatlens/json_schemas", "chatlens/data": "chatlens/data", "pipeline/model/adapters":
           "pipeline/model/adapters", "prompts": "pipeline/assets/prompts"}
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    site: Path  # the fresh venv's site-packages
    work: Path  # the working directory of its commands: not the checkout
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=self.work, env=self.env, capture_output=True, text=True, **kwargs)


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in NOT_COPIED or n.endswith(".egg-info") or n.startswith(".chatlens")}


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    source, dist, venv, work = base / "src", base / "dist", base / "venv", base / "work"
    shutil.copytree(REPO, source, ignore=_ignore)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(dist), str(source))
    wheel = next(dist.glob("chatlens-*.whl"))
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel))
    fresh_site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                           cwd=base).stdout.strip())
    borrowed = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (fresh_site / "_chatlens_test_dependencies.pth").write_text("".join(f"{p}\n" for p in borrowed))
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "CHATLENS_PROMPTS_DIR")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PYTHONNOUSERSITE="1")
    return Installed(wheel, venv, fresh_site, work, env)


def test_the_wheel_holds_every_package_and_the_files_the_code_reads(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for package in PACKAGES:  # every module of the checkout: pyproject.toml lists the packages one by one
        for module in (REPO / package).rglob("*.py"):
            assert module.relative_to(REPO).as_posix() in names, f"{module.parent} is not in pyproject.toml's packages"
    for folder, inside in SHIPPED.items():
        files = [f for f in (REPO / folder).rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        assert files, folder
        for file in files:
            assert f"{inside}/{file.relative_to(REPO / folder).as_posix()}" in names, f"{file} is not in the wheel"
    for name in (*(f"{split}.jsonl" for split in SPLITS), "README.md"):
        assert f"pipeline/assets/data/{name}" in names
    assert not any(n.startswith(("pipeline/assets/data/source/", "pipeline/assets/data/tools/", "tests/"))
                   for n in names), "only the corpus's splits ship"


PROBE = """
import hashlib, json, sys
import app, chatlens, pipeline
from app.main import STATIC_DIR
from app.web import TEMPLATES_DIR
from pipeline.corpus import DATA_DIR, load_split
from pipeline.model.training.format import template
from pipeline.model.training.adapters import SHIPPED_ADAPTER, manifest_path
from pipeline.prompts import PROMPTS_DIR, load_prompts

print(json.dumps({
    "modules": {m.__name__: m.__file__ for m in (app, chatlens, pipeline)},
    "sys_path": sys.path,
    "dirs": {"prompts": str(PROMPTS_DIR), "data": str(DATA_DIR), "templates": str(TEMPLATES_DIR),
             "static": str(STATIC_DIR), "adapter": str(SHIPPED_ADAPTER)},
    "prompts": {v: [p.version, p.templates] for v in ("completion", "chat") for p in [load_prompts(v)]},
    "tuned_template": template(),
    "splits": {s: len(load_split(s)) for s in ("train", "dev", "test")},
    "adapter_sha256": hashlib.sha256(SHIPPED_ADAPTER.read_bytes()).hexdigest(),
    "manifest": manifest_path(SHIPPED_ADAPTER).is_file(),
}))
"""


def test_packages_and_their_files_come_from_the_installed_wheel(installed):
    import hashlib

    from pipeline.corpus import load_split
    from pipeline.model.training.format import template
    from pipeline.model.training.adapters import SHIPPED_ADAPTER
    from pipeline.prompts import load_prompts

    done = installed.run(installed.bin("python"), "-c", PROBE)
    assert done.returncode == 0, done.stderr[-4000:]
    probe = json.loads(done.stdout)
    site_packages = installed.site.resolve()
    for name, file in probe["modules"].items():
        assert Path(file).resolve() == site_packages / name / "__init__.py", (name, file)
    borrowed = {Path(p).resolve() for p in site.getsitepackages()}  # the dependencies (.venv sits in the checkout)
    checkout = [p for p in probe["sys_path"] if Path(p or installed.work).resolve().is_relative_to(REPO)
                and Path(p).resolve() not in borrowed]
    assert not checkout, probe["sys_path"]
    expected = {"prompts": "pipeline/assets/prompts", "data": "pipeline/assets/data", "templates": "app/templates",
                "static": "app/static", "adapter": "pipeline/model/adapters/chatlens-gemma3-270m.lora.h5"}
    for key, inside in expected.items():
        assert Path(probe["dirs"][key]).resolve() == site_packages / inside, (key, probe["dirs"][key])
    # The same files as the checkout's, read through the installed package.
    assert probe["prompts"] == {v: [p.version, p.templates] for v in ("completion", "chat") for p in [load_prompts(v)]}
    assert probe["tuned_template"] == template()
    assert probe["splits"] == {split: len(load_split(split)) for split in SPLITS}
    assert probe["adapter_sha256"] == hashlib.sha256(SHIPPED_ADAPTER.read_bytes()).hexdigest() and probe["manifest"]


@pytest.mark.slow  # `chatlens analyze`: a whole Beam pipeline, in a subprocess
def test_analyze_runs_from_the_installed_wheel(installed, model_cache, tmp_path):
    """`chatlens analyze` on a tiny random Gemma (the real tokenizer, seconds): the model stage reads
    the completion prompts from the installed package; one window, one malformed line, one repeat."""
    from pipeline.prompts import load_prompts

    preset = tmp_path / "tiny-gemma"
    tiny_gemma_lm(model_cache).save_to_preset(str(preset))
    window = (REPO / "tests" / "data" / "e2e_windows.jsonl").read_text(encoding="utf-8").splitlines()[0]
    source = installed.work / "chats.jsonl"
    source.write_text("\n".join([window, '{"chat_id": "broken"}', window]) + "\n", encoding="utf-8")
    done = installed.run(installed.bin("chatlens"), "analyze", source.name, "--model", str(preset),
                         "--model-cache", str(model_cache), "--reply-for", "none", "--no-progress", timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    insights = [ChatInsight.model_validate_json(line)
                for line in (installed.work / "chats.insights.jsonl").read_text().splitlines()]
    letters = [DeadLetter.model_validate_json(line)
               for line in (installed.work / "chats.insights.deadletter.jsonl").read_text().splitlines()]
    assert [i.chat_id for i in insights] == [json.loads(window)["chat_id"]]
    assert insights[0].model_id == "tiny-gemma" and insights[0].prompt_version == load_prompts("completion").version
    assert [letter.attributes["line"] for letter in letters] == ["2"]
    summary = done.stderr.strip().splitlines()[-1]
    assert "3 line(s)" in summary and "1 insight(s)" in summary and "1 dead letter(s)" in summary
    assert "1 duplicate(s) skipped" in summary
    assert "Traceback" not in done.stderr


def test_dashboard_runs_from_the_installed_wheel(installed, pubsub_server):
    """Templates and static files come from the installed package; SIGTERM stops it cleanly."""
    from localpubsub.admin import ensure_layout

    ensure_layout(DEFAULT_PROJECT, emulator_host=pubsub_server)
    url, port = sqlite_url(installed.work, "wheel-dashboard.db"), free_port()
    env = {**installed.env, "PUBSUB_EMULATOR_HOST": pubsub_server, "CHATLENS_SUBSCRIBER_PROBE_SECONDS": "1"}
    add = subprocess.run([installed.bin("chatlens"), "users", "--database-url", url, "add", "ann", "--password-stdin"],
                         input=f"{PASSWORD}\n", text=True, capture_output=True, cwd=installed.work, env=env)
    assert add.returncode == 0, add.stderr[-4000:]
    command = [installed.bin("chatlens"), "-v", "dashboard", "--port", str(port), "--database-url", url]
    with dashboard_process(command, port, cwd=installed.work, env=env, timeout=60) as (process, output):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert client.get("/healthz").status_code == 200
            login = client.get("/login")
            assert login.status_code == 200 and 'name="password"' in login.text  # login.html, from site-packages
            for static in ("vendor/htmx-2.0.11.min.js", "app.css", "app.js", "vendor/swagger-ui-5.35.0/swagger-ui.css"):
                served = client.get(f"/static/{static}")
                assert served.status_code == 200 and served.content == (REPO / "app/static" / static).read_bytes()
            assert client.get("/docs").status_code == 200  # Swagger UI, vendored under static/
            client.post("/api/session", json={"username": "ann", "password": PASSWORD}).raise_for_status()
            queue = client.get("/")
            assert queue.status_code == 200 and "htmx-2.0.11.min.js" in queue.text  # queue.html on base.html
            assert client.get("/partials/queue").status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    text = "".join(output)
    assert "Traceback" not in text, text
    assert "dashboard ready" in text and "dashboard stopped" in text, text
