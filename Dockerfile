# The dispatcher image used by manifests/deployment.yaml:
#   docker build -t appwrapper-dispatcher:latest .
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY dispatcher ./dispatcher
RUN pip install --no-cache-dir . && useradd --uid 65532 --no-create-home dispatcher
USER 65532
ENTRYPOINT ["appwrapper-dispatcher"]
CMD ["run"]
