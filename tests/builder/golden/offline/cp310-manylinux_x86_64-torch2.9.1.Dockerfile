# ampforge build recipe for cell cp310-manylinux_x86_64-torch2.9.1
# Rendered by `python -m builder render` from tests/builder/golden/offline.yaml with docker/X86/Dockerfile.j2.
# Do not edit: change the config or the template and render again.
#
# Proxies are not written here, on purpose. The engine passes HTTP_PROXY, HTTPS_PROXY,
# NO_PROXY and ALL_PROXY (both cases) as Docker's predefined build arguments: RUN steps
# see them, and they stay out of the image's layers, history and environment as long as
# this file never declares them with ARG or copies them into ENV.
# Offline recipe: nothing below downloads; pip only reads the wheelhouse at /wheelhouse.

FROM quay.io/pypa/manylinux_2_28_x86_64:2025.08.15-1@sha256:6f42f4382bc73e9584206e6722e001922c0d4846c932fccaa04c0e35903b717d

# What this image is for; the engine reads these back (docker inspect) and the build steps
# read the ENV below, so no cell value is ever spliced into a shell command.
LABEL io.ampforge.cell="cp310-manylinux_x86_64-torch2.9.1" \
      io.ampforge.arch="X86" \
      io.ampforge.python="3.10" \
      io.ampforge.torch="2.9.1" \
      io.ampforge.plat="manylinux_2_28_x86_64" \
      io.ampforge.family="manylinux" \
      io.ampforge.base-image="quay.io/pypa/manylinux_2_28_x86_64:2025.08.15-1@sha256:6f42f4382bc73e9584206e6722e001922c0d4846c932fccaa04c0e35903b717d" \
      io.ampforge.config="tests/builder/golden/offline.yaml"

ENV AMPFORGE_CELL="cp310-manylinux_x86_64-torch2.9.1" \
    AMPFORGE_MACHINE="x86_64" \
    AMPFORGE_PYTHON="/opt/python/cp310-cp310/bin/python" \
    AMPFORGE_PYTHON_VERSION="3.10" \
    AMPFORGE_TORCH="2.9.1" \
    AMPFORGE_PLAT="manylinux_2_28_x86_64" \
    AUDITWHEEL_PLAT="manylinux_2_28_x86_64" \
    AMPFORGE_VENV="/opt/ampforge/venv" \
    AMPFORGE_BUILD_USER="builder" \
    AMPFORGE_OFFLINE="1" \
    PYTHONDONTWRITEBYTECODE="1"

# x86_64 cells build natively on an x86_64 host; fail early on a wrong-arch base image.
RUN machine="$(uname -m)"; \
    if [ "$machine" != "$AMPFORGE_MACHINE" ]; then \
        echo "ampforge: the base image runs as $machine, expected $AMPFORGE_MACHINE for $AMPFORGE_CELL" >&2; \
        exit 1; \
    fi

# pip configuration (environment form, so `docker run -e` can still override one run).
ENV PIP_DISABLE_PIP_VERSION_CHECK="1" \
    PIP_NO_INDEX="1" \
    PIP_FIND_LINKS="/wheelhouse" \
    PIP_NO_INPUT="1"

# The cell's interpreter must exist and be the right version; the build runs in a venv
# made from it (owned by the build user), so torch never lands in the base interpreter.
RUN set -eu; \
    if [ ! -x "$AMPFORGE_PYTHON" ]; then \
        echo "ampforge: $AMPFORGE_PYTHON not found in the base image; expected CPython $AMPFORGE_PYTHON_VERSION there (config: images.<arch>.python_path)" >&2; \
        exit 1; \
    fi; \
    "$AMPFORGE_PYTHON" -c 'import os, sys; want = os.environ["AMPFORGE_PYTHON_VERSION"]; have = "%d.%d" % sys.version_info[:2]; sys.exit(0 if have == want else "ampforge: interpreter is " + have + ", expected " + want)'; \
    id -u "$AMPFORGE_BUILD_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$AMPFORGE_BUILD_USER"; \
    "$AMPFORGE_PYTHON" -m venv "$AMPFORGE_VENV"; \
    mkdir -p /build /wheelhouse; \
    chown -R "$AMPFORGE_BUILD_USER" "$AMPFORGE_VENV" /build
ENV PATH="/opt/ampforge/venv/bin:${PATH}"

# Tools the pipeline runs in this image: a C++ compiler, patchelf and auditwheel (repair).
# Offline: nothing can be installed, so the base image must already have them.
RUN set -eu; missing=""; \
    for tool in g++ patchelf auditwheel; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done; \
    if [ -n "$missing" ]; then \
        echo "ampforge: the base image lacks:$missing; offline builds need a base image that has them (see: python -m builder base-image)" >&2; \
        exit 1; \
    fi

# The default user stays root so the engine can prepare mounts and folders; it runs the
# build steps as the unprivileged $AMPFORGE_BUILD_USER (exec with user=builder), who owns
# the venv and /build. At run time the engine mounts the project, an output folder and,
# offline, the wheelhouse at /wheelhouse.
WORKDIR /build
