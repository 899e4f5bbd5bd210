#!/usr/bin/env bash
# Builds the image's base from Debian's packages, for machines that reach Debian's mirror but
# no container registry (python:3.11-slim cannot be pulled there), unless buildah holds it
# already. `make image BASE=local` uses it; the Dockerfile builds on it as on python:3.11-slim.
#   debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd
#   $BASE_SUITE (bookworm: Python 3.11, the interpreter requirements/image.txt is locked for)
# The root filesystem is cached as a tarball under the cache directory, with the list of its
# packages (name, version) beside it; the image is imported into buildah's storage
# ($STORAGE_DRIVER, vfs by default: it needs no overlay mount) and its ID written beside the
# tarball. To pin the packages to one day's archive, name a snapshot as the mirror:
#   DEBIAN_MIRROR=http://snapshot.debian.org/archive/debian/20260101T000000Z
# Needs root (debootstrap), and installs buildah and debootstrap with apt-get when missing.
# Output: the image's name, printed on stdout. About 70 s the first time.
set -euo pipefail
suite="${BASE_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
image="${BASE_IMAGE:-localhost/appwrapper-dispatcher-base:$suite}"
cache="${APPWRAPPER_CACHE_DIR:-$HOME/.cache/appwrapper-dispatcher}/base-image/$suite"
buildah=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")

missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || [[ -f "$cache/rootfs.tar" ]] || missing+=(debootstrap)
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "build-base-image: ${missing[*]} missing, and installing it needs root and apt-get:" \
      "sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

if "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

if [[ ! -f "$cache/rootfs.tar" ]]; then
  if [[ $(id -u) != 0 ]]; then
    echo "build-base-image: debootstrap needs root (it makes device files and chroots):" \
      "run as root, or pull python:3.11-slim where a registry answers" >&2
    exit 1
  fi
  echo "debootstrap $suite from $mirror" >&2
  start=$SECONDS
  mkdir -p "$cache"
  root="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    "$suite" "$root" "$mirror" >&2
  chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$cache/packages.txt"
  # What only apt and people need: the package lists and caches, manuals, translations and
  # documentation (but each package's copyright notice).
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
  find "$root/usr/share/doc" -type f ! -name copyright -delete
  # In name order with one time stamp, so that the same packages make the same tarball.
  tar --sort=name --numeric-owner --mtime="@${SOURCE_DATE_EPOCH:-0}" --xattrs \
    -C "$root" -cf "$cache/rootfs.tar.part" .
  mv "$cache/rootfs.tar.part" "$cache/rootfs.tar"
  sha256sum "$cache/rootfs.tar" | cut -d' ' -f1 >"$cache/rootfs.tar.sha256"
  echo "rootfs of $suite in $((SECONDS - start))s: $(du -h "$cache/rootfs.tar" | cut -f1)" >&2
fi

container="$("${buildah[@]}" from scratch)"
trap '"${buildah[@]}" rm "$container" >/dev/null 2>&1 || true' EXIT
"${buildah[@]}" add "$container" "$cache/rootfs.tar" / >/dev/null
"${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd python3 \
  --label "org.opencontainers.image.description=Debian $suite minbase with python3, from $mirror" \
  --label "dev.appwrapper-dispatcher.rootfs.sha256=$(cat "$cache/rootfs.tar.sha256")" \
  "$container"
"${buildah[@]}" commit --quiet --timestamp 0 "$container" "$image" >"$cache/image-id"
echo "imported $image (ID $(cut -c1-12 "$cache/image-id"))" >&2
echo "$image"
