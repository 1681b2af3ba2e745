# Simulator env server: the embedded Android simulator behind the token-protected HTTP env protocol.
#   docker build -f docker/simenv.Dockerfile -t mobilerl/simenv .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY mobilerl ./mobilerl
# Only the core dependencies: the simulator and the server need no torch.
RUN pip install --no-cache-dir -c constraints.txt -e .
EXPOSE 8765
# Inside a container the server must listen on all interfaces; compose publishes it on 127.0.0.1 only.
# The token comes from MOBILERL_ENV_TOKEN (required: the server refuses requests without it).
ENTRYPOINT ["mobilerl", "env", "serve", "--host", "0.0.0.0", "--port", "8765", "--backend", "sim"]
CMD ["--size", "8"]
