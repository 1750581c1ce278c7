#!/usr/bin/env bash
# Provision the aarch64 cross toolchain and QEMU user emulation on a Debian x86_64 host.
#
# Idempotent: every step checks first, so a second run does (almost) nothing.
# Needs root (apt, dpkg --add-architecture, mounting binfmt_misc).
#
#   builder/cross/provision.sh            # toolchain + qemu + binfmt + arm64 apt architecture
#
# What it sets up and why:
# - g++-aarch64-linux-gnu, libc6-dev-arm64-cross: the cross compiler and the target C library
#   (also the --ldpaths auditwheel needs to resolve libc/libstdc++ of an aarch64 module);
# - qemu-user: `qemu-aarch64 -L SYSROOT prog` runs the verification Python;
# - qemu-user-static + binfmt-support: registers qemu-aarch64 with binfmt_misc (flags PF) so that
#   aarch64 programs also run directly and inside containers (the emulated docker path needs it);
# - dpkg --add-architecture arm64: lets `apt-get download PKG:arm64` fetch the target Python
#   .debs that builder.cross.sysroot unpacks with `dpkg -x` (nothing arm64 is installed).
#   Other suites' Pythons (bullseye 3.9, trixie 3.13) need nothing more here: builder.cross
#   reads them through a private apt configuration under ~/.cache/ampforge/apt/.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" -ne 0 ]; then
    echo "provision.sh: must run as root (apt-get, dpkg --add-architecture, mount)" >&2
    exit 2
fi

need_update=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    need_update=1
fi

packages=(g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user qemu-user-static binfmt-support
          patchelf dpkg-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Only sources that actually publish arm64 indices should be asked for them; third-party
# sources without an Architectures: line make `apt-get update` print warnings, not fail.
if [ "$need_update" -eq 1 ] || [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
fi
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# binfmt_misc is not mounted by default in containers/VMs without systemd.
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
        || echo "provision.sh: warning: cannot mount binfmt_misc; qemu-aarch64 -L still works" >&2
fi
if [ -e /proc/sys/fs/binfmt_misc/status ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 2>/dev/null \
        || update-binfmts --import qemu-aarch64 2>/dev/null \
        || echo "provision.sh: warning: could not register qemu-aarch64 with binfmt_misc" >&2
fi

aarch64-linux-gnu-g++ --version | head -n1
qemu-aarch64 --version | head -n1
if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    echo "binfmt: qemu-aarch64 $(grep '^flags' /proc/sys/fs/binfmt_misc/qemu-aarch64)"
fi
