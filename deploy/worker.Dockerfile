# The ChatLens Beam worker image: Beam's Python SDK container with ChatLens installed and the
# model baked in. It is the --sdk_container_image on Dataflow, the --environment_config on
# Flink, and the `pipeline` service of docker-compose.yml (which runs `chatlens` instead of
# the Beam boot entrypoint).
#
#   docker build -f deploy/worker.Dockerfile -t chatlens-worker .                      # CPU
#   docker build -f deploy/worker.Dockerfile --build-arg JAX_ACCELERATOR=cuda12 -t chatlens-worker:gpu .
#   docker build -f deploy/worker.Dockerfile --build-arg MODEL_PRESET=deploy/models/my_preset -t ... .
#
# The Python and Beam versions of the base image must match the project's (tests/deploy/test_deploy.py
# checks them against pyproject.toml and the installed apache_beam).
FROM apache/beam_python3.11_sdk:2.77.0

# cpu: JAX on CPU. cuda12: JAX with its CUDA 12 wheels, for GPU workers (NVIDIA L4 on Dataflow).
ARG JAX_ACCELERATOR=cpu
# A keras-hub preset directory inside the build context to bake instead of the bundled
# Gemma 3 270M, e.g. deploy/models/gemma3_instruct_1b (see deploy/models/README.md).
ARG MODEL_PRESET=

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KERAS_BACKEND=jax \
    XLA_PYTHON_CLIENT_PREALLOCATE=false \
    TF_CPP_MIN_LOG_LEVEL=2 \
    CHATLENS_CACHE=/opt/chatlens/cache \
    CHATLENS_MODEL=/opt/chatlens/preset \
    CHATLENS_PROMPTS_DIR=/opt/chatlens/src/prompts

WORKDIR /opt/chatlens/src

# Dependencies first, pinned by constraints.txt: this layer is rebuilt only when they change.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && if [ "$JAX_ACCELERATOR" = "cuda12" ]; then \
           pip install -c constraints.txt "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')"; \
       elif [ "$JAX_ACCELERATOR" != "cpu" ]; then \
           echo "JAX_ACCELERATOR must be cpu or cuda12, not '$JAX_ACCELERATOR'" >&2; exit 1; \
       fi \
    && python -c "import apache_beam, sys; assert apache_beam.__version__ == '2.77.0', apache_beam.__version__"

# The project, installed editable: its prompts/ and app/ templates are read from this tree.
COPY README.md ./
COPY chatlens ./chatlens
COPY localpubsub ./localpubsub
COPY cli ./cli
COPY pipeline ./pipeline
COPY app ./app
COPY prompts ./prompts
COPY deploy/bake_model.py ./deploy/bake_model.py
RUN pip install --no-deps -e . && chatlens --help > /dev/null

# The model, converted (or copied) now so that workers never download or convert at start.
COPY ${MODEL_PRESET:-deploy/models/README.md} /opt/chatlens/preset/
RUN python deploy/bake_model.py --cache "$CHATLENS_CACHE" --link "$CHATLENS_MODEL" --prune \
        ${MODEL_PRESET:+--preset "$CHATLENS_MODEL"}

# Beam's SDK harness boot: Dataflow and portable runners start workers through it.
ENTRYPOINT ["/opt/apache/beam/boot"]
