# mkd's production image: the dispatcher, the agent and mkctl, nothing else (no simulator, no test tools).
#   make image            (docker or podman)
#   docker run --rm mkd:0.1.0 --help
# Stage 1 builds the wheel from the source tree; stage 2 installs it into a virtualenv with the
# production dependencies pinned by requirements/prod.lock (packaging/install-prod.sh, which
# tests/test_packaging.py runs too); stage 3 copies only that virtualenv onto a slim base and runs as a
# non-root user.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY federation/ federation/
COPY dispatcher/ dispatcher/
COPY worker_agent/ worker_agent/
COPY mkctl/ mkctl/
COPY migrations/ migrations/
RUN python -m pip wheel --no-cache-dir --no-deps -w /wheels .

FROM ${PYTHON_IMAGE} AS install
COPY requirements/prod.lock /tmp/prod.lock
COPY packaging/install-prod.sh /tmp/install-prod.sh
COPY --from=wheel /wheels /wheels
ENV PIP_NO_CACHE_DIR=1
RUN sh /tmp/install-prod.sh /wheels /opt/mkd /tmp/prod.lock

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="mkd" \
      org.opencontainers.image.description="Multi-cluster dispatcher for Kubernetes training jobs (dispatcher, agent, mkctl)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=install /opt/mkd /opt/mkd
RUN groupadd --system --gid 65532 mkd && useradd --system --uid 65532 --gid mkd --no-create-home mkd
ENV PATH=/opt/mkd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["mkctl"]
CMD ["--help"]
