# Rollout server: vLLM's OpenAI-compatible server for the policy being trained (weights mounted at /models).
#   docker build -f docker/rollout.Dockerfile -t mobilerl/rollout .
FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY constraints.txt /tmp/constraints.txt
RUN pip install --upgrade pip && pip install -c /tmp/constraints.txt "vllm==0.28.0"
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]
# processed logprobs = log_softmax(logits / T): the definition every generation backend uses
CMD ["/models/policy", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "policy", "--logprobs-mode", "processed_logprobs"]
