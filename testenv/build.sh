#!/usr/bin/env bash
# Builds the local control plane into the cache directory, only what is missing.
#   k8s       etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#   kwok      fake nodes and pods (plus its stage files)
#   kuberay   the KubeRay operator (plus its CRDs)
#   kueue-crds  Kueue's quota CRDs, downloaded from the Go module proxy (Kueue is not built)
# Output: $APPWRAPPER_CACHE_DIR/bin/<version-stamp>/ (default ~/.cache/appwrapper-dispatcher).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
cache="${APPWRAPPER_CACHE_DIR:-$HOME/.cache/appwrapper-dispatcher}"
# Rebuild whenever the pinned module set changes.
stamp="$(sha256sum go.mod go.sum kuberay/go.mod kuberay/go.sum cmd/k8s/*.go | sha256sum | cut -c1-12)"
out="$cache/bin/$stamp"
mkdir -p "$out"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
ldflags="-s -w"
for p in "${pkgs[@]}"; do
  ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

build() { # module-dir name package
  if [[ ! -x "$out/$2" ]]; then
    echo "building $2 ($3)" >&2
    local start=$SECONDS
    (cd "$1" && go build -trimpath -ldflags "$ldflags" -o "$out/$2.tmp" "$3")
    mv "$out/$2.tmp" "$out/$2"
    echo "built $2 in $((SECONDS - start))s" >&2
  fi
}
build . k8s ./cmd/k8s
build . kwok sigs.k8s.io/kwok/cmd/kwok
# KubeRay is built in a module of its own: it needs an older controller-runtime than KWOK.
build kuberay kuberay-operator github.com/ray-project/kuberay/ray-operator

copy_dir() { # module-dir module subdir dest
  if [[ ! -d "$out/$4" ]]; then
    local dir
    dir="$(cd "$1" && go list -m -f '{{.Dir}}' "$2")"
    shift
    mkdir -p "$out/$3.tmp"
    cp -r "$dir/$2/." "$out/$3.tmp/"
    chmod -R u+w "$out/$3.tmp"
    mv "$out/$3.tmp" "$out/$3"
  fi
}
copy_dir . sigs.k8s.io/kwok kustomize/stage kwok-stages
copy_dir kuberay github.com/ray-project/kuberay/ray-operator config/crd/bases kuberay-crds
# Kueue's quota CRDs (not Kueue): what the kueue_quotas tests create objects of. Only the
# module is downloaded (no build), outside any module so no go.mod here changes; its other
# CRDs (Workloads: 1.4 MB) are not needed.
kueue_version=v0.15.0
if [[ ! -d "$out/kueue-crds" ]]; then
  outside="$(mktemp -d)"
  kueue_dir="$(cd "$outside" && GO111MODULE=on go mod download -json "sigs.k8s.io/kueue@$kueue_version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  rmdir "$outside"
  mkdir -p "$out/kueue-crds.tmp"
  for kind in clusterqueues localqueues cohorts resourceflavors workloadpriorityclasses; do
    cp "$kueue_dir/config/components/crd/bases/kueue.x-k8s.io_$kind.yaml" "$out/kueue-crds.tmp/"
  done
  chmod -R u+w "$out/kueue-crds.tmp"
  mv "$out/kueue-crds.tmp" "$out/kueue-crds"
fi
ln -sfn k8s "$out/kubectl"
ln -sfn "$out" "$cache/bin/current"
echo "$out"
