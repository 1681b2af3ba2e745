# Trainer: CUDA + PyTorch + DeepSpeed + LLaMA-Factory + the project. Runs DVC stages (SFT, RL) on GPUs.
#   docker build -f docker/trainer.Dockerfile -t mobilerl/trainer .
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DO_NOT_TRACK=true \
    MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv python3.11-dev git build-essential ninja-build tesseract-ocr \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /workspace
COPY pyproject.toml constraints.txt README.md ./
COPY mobilerl ./mobilerl
# On GPU the CUDA build of torch comes from the index; constraints pin the rest of the stack.
RUN pip install --upgrade pip setuptools wheel \
    && pip install -c constraints.txt torch==2.13.0 \
    && DS_BUILD_OPS=0 pip install --no-build-isolation -c constraints.txt -e ".[train,pipeline,privacy,cluster]"
COPY stages ./stages
COPY pipelines ./pipelines
COPY configs ./configs
COPY dvc.yaml dvc.lock params.yaml ./
COPY .dvc/config .dvc/config
# The image has the project's files, not its git history: DVC runs without git here.
RUN dvc config --local core.no_scm true
# Weights are mounted, never downloaded: -v /models:/models (see docker/README.md).
VOLUME ["/models", "/workspace/data", "/workspace/mlruns"]
ENTRYPOINT ["dvc", "repro"]
