#!/usr/bin/env bash
# ChatLens on Google Cloud Dataflow: build the images and the Flex Template, launch the streaming
# job on GPU workers, update it in place, or drain it. See deploy/README.md.
#
#   deploy/dataflow/deploy.sh build    # worker image (JAX on CUDA, model baked in), launcher image, template spec
#   deploy/dataflow/deploy.sh launch   # start the job from the template
#   deploy/dataflow/deploy.sh update   # replace the running job in place (same JOB_NAME): state and backlog kept
#   deploy/dataflow/deploy.sh drain    # stop reading, finish and publish what was read, then stop
#   deploy/dataflow/deploy.sh submit   # no template: `chatlens pipeline --runner DataflowRunner` from here
#
# Settings come from the environment. PROJECT and BUCKET are required; the rest have defaults:
#   REGION=us-central1  REPOSITORY=chatlens (Artifact Registry, docker format)  TAG=<git commit>
#   MODE=windows (or messages)  JOB_NAME=chatlens-$MODE
#   MACHINE_TYPE=g2-standard-4  GPU='type:nvidia-l4;count:1;install-nvidia-driver' (GPU=none: CPU workers)
#   DISK_SIZE_GB=50  NUM_WORKERS=1  MAX_WORKERS=4  MODEL_PRESET= (a preset to bake: deploy/models/README.md)
#   PARAMETERS= more template parameters, '~'-separated: 'reply_for=all~max_batch_size=16'
#   TRANSFORM_NAME_MAPPINGS= for update, when transforms were renamed: '{"OldName":"NewName"}'
#   DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail

cd "$(dirname "$0")/../.."

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

command_name=${1:-help}
case "$command_name" in
  build | launch | update | drain | submit) ;;
  help | -h | --help) usage; exit 0 ;;
  *) echo "unknown command '$command_name'" >&2; usage >&2; exit 2 ;;
esac

: "${PROJECT:?set PROJECT to the Google Cloud project id}"
: "${BUCKET:?set BUCKET to a Cloud Storage bucket (no gs://) for staging, temp files and the template}"
REGION=${REGION:-us-central1}
REPOSITORY=${REPOSITORY:-chatlens}
TAG=${TAG:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}
: "${TAG:?set TAG (no git commit to name the images after)}"
MODE=${MODE:-windows}
JOB_NAME=${JOB_NAME:-chatlens-$MODE}
GPU=${GPU:-type:nvidia-l4;count:1;install-nvidia-driver}
if [[ "$GPU" == none ]]; then
  MACHINE_TYPE=${MACHINE_TYPE:-n2-standard-4}
  JAX_ACCELERATOR=cpu
else
  MACHINE_TYPE=${MACHINE_TYPE:-g2-standard-4}  # L4 GPUs come only with G2 machines
  JAX_ACCELERATOR=cuda12
fi
DISK_SIZE_GB=${DISK_SIZE_GB:-50}  # the CUDA worker image is several GB
NUM_WORKERS=${NUM_WORKERS:-1}
MAX_WORKERS=${MAX_WORKERS:-4}
MODEL_PRESET=${MODEL_PRESET:-}
PARAMETERS=${PARAMETERS:-}
TRANSFORM_NAME_MAPPINGS=${TRANSFORM_NAME_MAPPINGS:-}

REGISTRY="$REGION-docker.pkg.dev/$PROJECT/$REPOSITORY"
WORKER_IMAGE="$REGISTRY/chatlens-worker:$TAG"
LAUNCHER_IMAGE="$REGISTRY/chatlens-launcher:$TAG"
TEMPLATE="gs://$BUCKET/templates/chatlens-$TAG.json"
# Where the worker image keeps the model (deploy/worker.Dockerfile): workers convert nothing.
MODEL_IN_IMAGE=/opt/chatlens/preset
CACHE_IN_IMAGE=/opt/chatlens/cache

run() {
  if [[ "${DRY_RUN:-}" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

build() {
  run gcloud auth configure-docker "$REGION-docker.pkg.dev" --quiet
  run docker build -f deploy/worker.Dockerfile \
    --build-arg "JAX_ACCELERATOR=$JAX_ACCELERATOR" --build-arg "MODEL_PRESET=$MODEL_PRESET" \
    -t "$WORKER_IMAGE" .
  run docker push "$WORKER_IMAGE"
  run docker build -f deploy/dataflow/flex.Dockerfile -t "$LAUNCHER_IMAGE" .
  run docker push "$LAUNCHER_IMAGE"
  run gcloud dataflow flex-template build "$TEMPLATE" \
    --project "$PROJECT" --image "$LAUNCHER_IMAGE" --sdk-language PYTHON \
    --metadata-file deploy/dataflow/metadata.json
}

# Template parameters: ChatLens's own (metadata.json) and Beam pipeline options, which the
# launcher hands to Beam as they are. '~' separates them (gcloud's ^~^ syntax) because the
# accelerator string contains ';', ':' and '='.
template_parameters() {
  local params="mode=$MODE~model=$MODEL_IN_IMAGE~model_cache=$CACHE_IN_IMAGE"
  params+="~sdk_container_image=$WORKER_IMAGE~sdk_location=container"
  params+="~autoscaling_algorithm=THROUGHPUT_BASED~disk_size_gb=$DISK_SIZE_GB"
  if [[ "$GPU" != none ]]; then
    params+="~dataflow_service_options=worker_accelerator=$GPU"
  fi
  if [[ -n "$PARAMETERS" ]]; then
    params+="~$PARAMETERS"
  fi
  printf '^~^%s' "$params"
}

run_template() {
  run gcloud dataflow flex-template run "$JOB_NAME" \
    --project "$PROJECT" --region "$REGION" \
    --template-file-gcs-location "$TEMPLATE" \
    --temp-location "gs://$BUCKET/tmp" --staging-location "gs://$BUCKET/staging" \
    --worker-machine-type "$MACHINE_TYPE" \
    --enable-streaming-engine --num-workers "$NUM_WORKERS" --max-workers "$MAX_WORKERS" \
    --parameters "$(template_parameters)" \
    "$@"
}

launch() {
  run_template
}

# In-place update: a new job with the same name replaces the running one, taking over its
# state (sessions, dedup) and its subscription position; nothing read is lost. Dataflow
# refuses an incompatible graph and leaves the old job running. Renamed transforms need
# TRANSFORM_NAME_MAPPINGS ('{"OldName":"NewName"}'); a different MODE is a different graph:
# launch a new job under another JOB_NAME, then drain this one.
update() {
  local extra=(--update)
  if [[ -n "$TRANSFORM_NAME_MAPPINGS" ]]; then
    extra+=("--transform-name-mappings=$TRANSFORM_NAME_MAPPINGS")
  fi
  run_template "${extra[@]}"
}

job_id() {
  if [[ -n "${JOB_ID:-}" ]]; then
    echo "$JOB_ID"
  elif [[ "${DRY_RUN:-}" == 1 ]]; then
    echo "JOB_ID_OF_$JOB_NAME"
  else
    gcloud dataflow jobs list --project "$PROJECT" --region "$REGION" --status active \
      --filter "name=$JOB_NAME" --format 'value(JOB_ID)' --limit 1
  fi
}

# Drain: the job stops pulling, finishes what it has read (closing open sessions early),
# publishes it and acknowledges it; what it never read stays in the subscription for the next
# job. Cancel, by contrast, drops in-flight work (Pub/Sub redelivers it, unacknowledged).
drain() {
  local id
  id=$(job_id)
  if [[ -z "$id" ]]; then
    echo "no active job named $JOB_NAME in $REGION" >&2
    exit 1
  fi
  run gcloud dataflow jobs drain "$id" --project "$PROJECT" --region "$REGION"
}

# The same job without a template, submitted from this machine (pip install -e '.[dataflow]').
submit() {
  local options=(
    --runner DataflowRunner --project "$PROJECT" --mode "$MODE"
    --model "$MODEL_IN_IMAGE" --model-cache "$CACHE_IN_IMAGE"
    --region "$REGION" --job_name "$JOB_NAME"
    --temp_location "gs://$BUCKET/tmp" --staging_location "gs://$BUCKET/staging"
    --sdk_container_image "$WORKER_IMAGE" --sdk_location container
    --machine_type "$MACHINE_TYPE" --disk_size_gb "$DISK_SIZE_GB"
    --enable_streaming_engine --autoscaling_algorithm=THROUGHPUT_BASED
    --num_workers "$NUM_WORKERS" --max_num_workers "$MAX_WORKERS"
  )
  if [[ "$GPU" != none ]]; then
    options+=("--dataflow_service_options=worker_accelerator=$GPU")
  fi
  if [[ "${UPDATE:-}" == 1 ]]; then
    options+=(--update)
    if [[ -n "$TRANSFORM_NAME_MAPPINGS" ]]; then
      options+=("--transform_name_mapping=$TRANSFORM_NAME_MAPPINGS")
    fi
  fi
  run "${CHATLENS:-chatlens}" pipeline "${options[@]}"
}

"$command_name"
