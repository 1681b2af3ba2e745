# Rollout engine: the project's OpenAI-compatible server with vLLM underneath, as an RL rollout engine that takes
# the trainer's weights (POST /v1/weights: reload from the shared volume, or a broadcast group) and reports the
# version that sampled each completion. Initial weights mounted at /models.
#   docker build -f docker/rollout.Dockerfile -t mobilerl/rollout .
FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY mobilerl ./mobilerl
# The gpu extra is vLLM (it brings the CUDA build of torch); constraints pin the rest of the stack.
RUN pip install --upgrade pip && pip install -c constraints.txt -e ".[gpu]"
EXPOSE 8000
# Inside a container the server listens on all interfaces (compose publishes it on 127.0.0.1 only); the API key
# comes from MOBILERL_API_KEY. vLLM samples with processed logprobs (log_softmax(logits / T)), like every backend.
ENTRYPOINT ["python", "-m", "mobilerl.models.serve_openai"]
CMD ["/models/policy", "--engine", "vllm", "--weight-sync", "--host", "0.0.0.0", "--port", "8000", "--name", "policy"]
