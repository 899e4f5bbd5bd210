# The dispatcher image used by manifests/deployment.yaml. Build it with `make image`
# (IMAGE=registry.example.com/appwrapper-dispatcher:TAG to name it; docker, podman or buildah).
#
# Only the runtime goes in: the Python dependencies at the exact versions and hashes of
# requirements/image.txt, and the dispatcher package (the test kit and the demo live in
# testenv/, outside it; tests/unit/test_runtime_imports.py proves nothing at run time imports
# them). Regenerate the lock with the command at its top.
#
# The base is any image with Python 3.11 as `python3`, its venv module and `useradd`:
# python:3.11-slim by default, or Debian bookworm's own python3 built from Debian's packages
# where no registry answers (`make image BASE=local`, testenv/build-base-image.sh). Both are
# used alike: everything is installed into a virtual environment, /opt/venv (Debian's python3
# refuses installs into the system's Python, PEP 668), made in a build stage and copied into
# the final image without pip.
ARG PYTHON_IMAGE=python:3.11-slim

# The wheel of the package, built from the sources alone by the pinned setuptools.
FROM ${PYTHON_IMAGE} AS wheel
# A CA bundle for pip to trust, for the build only (a proxy that re-signs TLS): `make image`
# mounts BUILD_CA there with podman or buildah and names it here. Empty: pip's own.
ARG PIP_CERT=
WORKDIR /src
COPY requirements/build.txt requirements/build.txt
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes --only-binary :all: \
       -r requirements/build.txt
COPY setup.cfg pyproject.toml README.md ./
COPY dispatcher ./dispatcher
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation \
       --wheel-dir /wheels .

# The runtime's environment: every dependency pinned and hash-checked, binary wheels only (no
# compiler in the image, and nothing built from an sdist at install time); then the package
# alone, without dependencies; then pip and setuptools taken out (nothing installs at run time).
FROM ${PYTHON_IMAGE} AS venv
ARG PIP_CERT=
COPY requirements/image.txt /tmp/image.txt
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --require-hashes --only-binary :all: -r /tmp/image.txt
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && /opt/venv/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM ${PYTHON_IMAGE}
ARG VERSION=unknown
LABEL org.opencontainers.image.title="appwrapper-dispatcher" \
      org.opencontainers.image.description="Gang dispatch of AppWrappers on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Every module of the package imported once, so that a dependency the lock lacks fails the
# build, not the pod; then the user the pod runs as.
RUN python -c "import importlib, pkgutil, dispatcher; [importlib.import_module(m.name) \
       for m in pkgutil.walk_packages(dispatcher.__path__, 'dispatcher.') \
       if m.name != 'dispatcher.__main__']" \
    && ! python -c "import pip" 2>/dev/null \
    && appwrapper-dispatcher --version \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin dispatcher
USER 65532
ENTRYPOINT ["appwrapper-dispatcher"]
CMD ["run"]
