# syntax=docker/dockerfile:1.18.0@sha256:dabfc0969b935b2080555ace70ee69a5261af8a8f1b4df97b9e7fbcf6722eddf
# One image for the webhook (`muster serve`), the binder (`muster bind`), the node agent
# (`muster agent`) and the chart's hook Jobs (`muster certs ...`).
#   docker build -t ghcr.io/muster/muster:0.1.0 .
# Without a registry: e2e/node/image.py builds it with buildah on a Debian base (--build-arg
# PYTHON=...), the same recipe.
# The base by digest (python:3.11.17-slim-bookworm's multi-platform index, amd64 and arm64): a
# tag rebuilt upstream cannot change what is built. Bump tag and digest together;
# tests/chart/test_image.py refuses a base without a digest.
ARG PYTHON=python:3.11.17-slim-bookworm@sha256:2333bd330d12de02514770b3585cad313644316047cdee24a7acfdece6de6efb

FROM ${PYTHON} AS build
# set only where pip needs another CA bundle to reach the index (e.g. a TLS-inspecting proxy):
# pass the path of a file mounted for the build, never copied into the image
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md requirements-image.txt ./
COPY webhook ./webhook
# the test doubles stay out of the image, except the fake NVML that `muster agent --fake-nvml`
# builds on nodes without GPUs (docs/architecture.md, "Layers")
RUN rm -r webhook/doubles/emulator webhook/doubles/fakekubelet.py webhook/doubles/webhooks.py
# a venv: the same recipe on the official Python image and on a Debian python3 base, whose
# system site-packages are externally managed (PEP 668). Wheels only (grpcio, cryptography...):
# no compiler in the image. requirements-image.txt is the runtime closure and the build backend
# at the versions CI tested (constraints.txt), each with its wheels' sha256: --require-hashes
# refuses any other file, --no-deps anything not listed. Muster itself is built offline
# (--no-index) with that setuptools (--no-build-isolation: no unpinned backend is fetched), then
# pip and setuptools leave the image.
RUN python3 -m venv /opt/muster \
 && /opt/muster/bin/pip install --require-hashes --no-deps --only-binary=:all: \
      -r requirements-image.txt \
 && /opt/muster/bin/pip install --no-deps --no-build-isolation --no-index . \
 && /opt/muster/bin/pip uninstall -q -y pip setuptools \
 && /opt/muster/bin/python -m compileall -q /opt/muster

FROM ${PYTHON}
LABEL org.opencontainers.image.title="muster" \
      org.opencontainers.image.description="Gang scheduling and NVLink-aware GPU placement for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
# bytecode was compiled at build time: nothing is written under a read-only root filesystem
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/muster /opt/muster
ENV PATH=/opt/muster/bin:$PATH
# the import line loads every command's engine and native extension (grpcio needs libstdc++, for
# one) and the fake NVML: a base image missing a shared library fails here, not in a
# crash-looping pod.
# 65532: the uid/gid the chart's pod securityContext runs as (runAsNonRoot needs a numeric USER)
RUN groupadd --system --gid 65532 muster \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin muster \
 && muster --help >/dev/null \
 && python -c "import webhook.admission.server, webhook.binder.service, webhook.agent.runner, webhook.certs.manager, webhook.doubles.fakenvml"
USER 65532:65532
# 8443: HTTPS admission (muster serve --port); 8080: plain-HTTP metrics (--metrics-port)
EXPOSE 8443 8080
ENTRYPOINT ["muster"]
CMD ["--help"]
