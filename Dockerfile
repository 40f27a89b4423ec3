# The lbtestbed image: one image for every role. `lbt` is the entry point (the load generator, cluster
# status); the dispatcher and the node hosts run `python -m lbtestbed.dispatcher|server_node`, set as the
# entry point of those services in deploy/compose.yaml and deploy/k8s/. Build from the repository root:
#   docker build -t lbtestbed:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Installed from a scratch copy that is then removed: a source tree left in the working directory would
# shadow the installed package for `python -m`. pyproject.toml names README.md as the readme: the build needs it.
COPY pyproject.toml README.md /tmp/src/
COPY lbtestbed /tmp/src/lbtestbed
RUN pip install /tmp/src && rm -rf /tmp/src

WORKDIR /opt/lbtestbed
# The example specs, so that `docker run lbtestbed:0.1.0 simulate examples/jiq.toml` works out of the box.
COPY examples ./examples

# A fixed numeric user, so that Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 lbt \
    && useradd --system --uid 10001 --gid lbt --no-create-home --shell /usr/sbin/nologin lbt
USER 10001:10001

# Every lbtestbed process listens on this port in its container (deploy/compose.yaml, deploy/k8s/).
EXPOSE 8000

ENTRYPOINT ["lbt"]
CMD ["--help"]
