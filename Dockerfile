# fastoip on CPU: onnxruntime, the native codec, a non-root user, nothing to build with.
#   docker build -t fastoip:cpu .
#   docker run --shm-size=256m -p 8000:8000 -p 8001:8001 -p 8002:8002 -v $PWD/models:/models fastoip:cpu
# --shm-size: /dev/shm holds clients' shared-memory regions (Python models' tensors cross in memfds the server
# makes, bounded by --python-shm-pool-total, not in /dev/shm).  Past it a registration or request fails, never
# the server.
# The build stage compiles the Cython codec (and, with the native gRPC frontend, links
# libnghttp2); the final stage gets the finished virtualenv and the run-time libraries only.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libnghttp2-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The README's CPU install: `pip install .` (fastoip with onnxruntime).
RUN python -m venv /opt/fastoip \
 && /opt/fastoip/bin/pip install --no-cache-dir .

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnghttp2-14 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/fastoip /opt/fastoip
ENV PATH=/opt/fastoip/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric UID: Kubernetes' runAsNonRoot can only be checked against a number.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin fastoip \
 && mkdir /models \
 && chown 10001:10001 /models
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000 8001 8002
# Ready = every model loaded; a slow load gets the start period.
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
ENTRYPOINT ["fastoip"]
CMD ["serve", "--model-repository", "/models", "--host", "0.0.0.0"]
