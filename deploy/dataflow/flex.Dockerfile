# The Flex Template launcher image: Dataflow runs it on a launcher VM to build the pipeline graph
# and submit the job, which then runs on workers started from the worker image
# (deploy/worker.Dockerfile, passed as sdk_container_image). Built by deploy/dataflow/deploy.sh:
#
#   docker build -f deploy/dataflow/flex.Dockerfile -t LAUNCHER_IMAGE .
#
# Graph construction imports what the workers import (minus the model), so the project is
# installed with the same pins, plus Beam's GCP extra for the DataflowRunner.
# Pin a dated tag of the launcher base for reproducible builds; latest follows Google's updates.
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base:latest

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KERAS_BACKEND=jax

WORKDIR /template

COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt "apache-beam[gcp]==2.77.0"

COPY README.md ./
COPY chatlens ./chatlens
COPY cli ./cli
COPY pipeline ./pipeline
COPY app ./app
COPY prompts ./prompts
COPY deploy/dataflow/launch.py ./launch.py
RUN pip install --no-deps -e . && python launch.py --help > /dev/null

# The launcher resolves the pipeline's defaults (PipelineConfig) here and they travel to the
# workers in the job's options: name the worker image's paths, where the model is baked.
ENV CHATLENS_CACHE=/opt/chatlens/cache \
    CHATLENS_MODEL=/opt/chatlens/preset \
    FLEX_TEMPLATE_PYTHON_PY_FILE=/template/launch.py
# The base image's ENTRYPOINT (the Flex Template launcher) stays as it is.
