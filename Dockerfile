# The dispatcher image used by manifests/deployment.yaml. Build it with `make image`
# (IMAGE=registry.example.com/appwrapper-dispatcher:TAG to name it; docker, podman or buildah).
#
# Only the runtime goes in: the Python dependencies at the exact versions and hashes of
# requirements/image.txt, and the package without dispatcher/testing (the test kit and the
# demo: .dockerignore keeps it out of the build context, setup.cfg out of the wheel;
# tests/unit/test_runtime_imports.py proves nothing at run time imports it). Regenerate the lock with the command at its top.
ARG PYTHON_IMAGE=python:3.11-slim

# The wheel of the package, built from the sources alone by the pinned setuptools.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY requirements/build.txt requirements/build.txt
RUN pip install --no-cache-dir --require-hashes --only-binary :all: -r requirements/build.txt
COPY setup.cfg pyproject.toml README.md ./
COPY dispatcher ./dispatcher
# Refuse a context that still holds the left-out modules (a builder that ignored
# .dockerignore) rather than ship them.
RUN test ! -e dispatcher/testing \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=unknown
LABEL org.opencontainers.image.title="appwrapper-dispatcher" \
      org.opencontainers.image.description="Gang dispatch of AppWrappers on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY requirements/image.txt /tmp/image.txt
# Every dependency pinned and hash-checked, binary wheels only (no compiler in the image, and
# nothing built from an sdist at install time); then the package alone, without dependencies.
RUN pip install --no-cache-dir --require-hashes --only-binary :all: -r /tmp/image.txt \
    && rm /tmp/image.txt
COPY --from=wheel /wheels /tmp/wheels
# Then every module of the package imported once, so that a dependency the lock lacks fails
# the build, not the pod.
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && python -c "import importlib, pkgutil, dispatcher; [importlib.import_module(m.name) \
       for m in pkgutil.walk_packages(dispatcher.__path__, 'dispatcher.') \
       if m.name != 'dispatcher.__main__']" \
    && appwrapper-dispatcher --version \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin dispatcher
USER 65532
ENTRYPOINT ["appwrapper-dispatcher"]
CMD ["run"]
