# The ChatLens dashboard image: the web UI and API with its Pub/Sub subscribers, plus the small
# commands that share its dependencies (`chatlens pubsub-init`, `chatlens simulate`,
# `chatlens users`). No model, no Beam, no JAX: the chatlens package is installed without its
# dependencies and deploy/dashboard-requirements.txt names what these commands import.
#
#   docker build -f deploy/dashboard.Dockerfile -t chatlens-dashboard .
#   docker run -p 127.0.0.1:8000:8000 -v chatlens-dashboard:/data chatlens-dashboard
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 chatlens \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/chatlens chatlens \
    && mkdir /data \
    && chown 10001:10001 /data

WORKDIR /opt/chatlens/src

COPY constraints.txt deploy/dashboard-requirements.txt ./
RUN pip install -c constraints.txt -r dashboard-requirements.txt

# Editable install: app/templates and app/static are read from this tree.
COPY pyproject.toml README.md ./
COPY chatlens ./chatlens
COPY localpubsub ./localpubsub
COPY cli ./cli
COPY app ./app
COPY pipeline ./pipeline
RUN pip install --no-deps -e . && chatlens --help > /dev/null

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /data
# The SQLite database lives on the /data volume; set CHATLENS_DATABASE_URL for PostgreSQL.
ENV CHATLENS_HOST=0.0.0.0 \
    CHATLENS_PORT=8000 \
    CHATLENS_DATABASE_URL=sqlite:////data/chatlens-dashboard.db
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CHATLENS_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["chatlens"]
CMD ["dashboard", "--host", "0.0.0.0", "--port", "8000"]
