# ampforge build recipe for cell cp312-manylinux_aarch64-torch2.9.1
# Rendered by `python -m builder render` from tests/builder/golden/debian.yaml with docker/ARM/Dockerfile.j2.
# Do not edit: change the config or the template and render again.
#
# Proxies are not written here, on purpose. The engine passes HTTP_PROXY, HTTPS_PROXY,
# NO_PROXY and ALL_PROXY (both cases) as Docker's predefined build arguments: RUN steps
# see them, and they stay out of the image's layers, history and environment as long as
# this file never declares them with ARG or copies them into ENV.

FROM registry.example:5000/debian-py-arm64:bookworm

# What this image is for; the engine reads these back (docker inspect) and the build steps
# read the ENV below, so no cell value is ever spliced into a shell command.
LABEL io.ampforge.cell="cp312-manylinux_aarch64-torch2.9.1" \
      io.ampforge.arch="ARM" \
      io.ampforge.python="3.12" \
      io.ampforge.torch="2.9.1" \
      io.ampforge.plat="manylinux_2_36_aarch64" \
      io.ampforge.family="debian" \
      io.ampforge.base-image="registry.example:5000/debian-py-arm64:bookworm" \
      io.ampforge.config="tests/builder/golden/debian.yaml"

ENV AMPFORGE_CELL="cp312-manylinux_aarch64-torch2.9.1" \
    AMPFORGE_MACHINE="aarch64" \
    AMPFORGE_PYTHON="/usr/bin/python3.12" \
    AMPFORGE_PYTHON_VERSION="3.12" \
    AMPFORGE_TORCH="2.9.1" \
    AMPFORGE_PLAT="manylinux_2_36_aarch64" \
    AUDITWHEEL_PLAT="manylinux_2_36_aarch64" \
    AMPFORGE_VENV="/opt/ampforge/venv" \
    AMPFORGE_BUILD_USER="builder" \
    AMPFORGE_OFFLINE="0" \
    PYTHONDONTWRITEBYTECODE="1"

# aarch64 cells: on an x86_64 host every RUN below executes under QEMU user emulation
# (binfmt_misc registered for qemu-aarch64). "exec format error" here means emulation is
# not set up; a wrong-arch base image fails the check with a message instead.
RUN machine="$(uname -m)"; \
    if [ "$machine" != "$AMPFORGE_MACHINE" ]; then \
        echo "ampforge: the base image runs as $machine, expected $AMPFORGE_MACHINE for $AMPFORGE_CELL" >&2; \
        exit 1; \
    fi

# Extra CA certificates (e.g. an intercepting proxy's), before anything touches the
# network. They go into the system trust store (update-ca-certificates), and one
# combined bundle is what SSL_CERT_FILE, PIP_CERT and REQUESTS_CA_BUNDLE name: manylinux
# images point SSL_CERT_FILE at certifi's bundle, so the system store alone is not enough.
COPY ampforge-ca.pem /usr/local/share/ampforge/extra-ca.pem
RUN set -eu; \
    extra=/usr/local/share/ampforge/extra-ca.pem; \
    bundle=/usr/local/share/ampforge/ca-bundle.pem; \
    if command -v update-ca-certificates >/dev/null 2>&1; then \
        mkdir -p /usr/local/share/ca-certificates; \
        cp "$extra" /usr/local/share/ca-certificates/ampforge-extra-ca.crt; \
        update-ca-certificates; \
    fi; \
    system=/etc/ssl/certs/ca-certificates.crt; \
    : > "$bundle"; \
    if [ -f "$system" ]; then cat "$system" >> "$bundle"; fi; \
    if [ -n "${SSL_CERT_FILE:-}" ] && [ -f "$SSL_CERT_FILE" ] && [ "$SSL_CERT_FILE" != "$system" ]; then \
        cat "$SSL_CERT_FILE" >> "$bundle"; \
    fi; \
    cat "$extra" >> "$bundle"
ENV SSL_CERT_FILE="/usr/local/share/ampforge/ca-bundle.pem" \
    PIP_CERT="/usr/local/share/ampforge/ca-bundle.pem" \
    REQUESTS_CA_BUNDLE="/usr/local/share/ampforge/ca-bundle.pem"

# pip configuration (environment form, so `docker run -e` can still override one run).
ENV PIP_DISABLE_PIP_VERSION_CHECK="1" \
    PIP_INDEX_URL="https://pypi.internal.example/simple" \
    PIP_EXTRA_INDEX_URL="https://download.internal.example/whl/cpu" \
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
# Debian-family image: apt for the compiler and patchelf, pip for auditwheel.
RUN set -eu; missing=""; \
    command -v g++ >/dev/null 2>&1 || missing="$missing g++"; \
    command -v patchelf >/dev/null 2>&1 || missing="$missing patchelf"; \
    if [ -n "$missing" ]; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    command -v auditwheel >/dev/null 2>&1 || "$AMPFORGE_VENV/bin/python" -m pip install --no-cache-dir auditwheel

# The default user stays root so the engine can prepare mounts and folders; it runs the
# build steps as the unprivileged $AMPFORGE_BUILD_USER (exec with user=builder), who owns
# the venv and /build. At run time the engine mounts the project, an output folder and,
# offline, the wheelhouse at /wheelhouse.
WORKDIR /build
