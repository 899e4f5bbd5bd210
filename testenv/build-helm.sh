#!/usr/bin/env bash
# Builds the helm v3 command from the Go module proxy into the cache directory, unless it is
# there already. Optional: only `make chart-test` and tests/e2e/test_chart.py use it, and
# `make test` skips the chart's e2e test when it is missing.
#   go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION  (helm's own go.mod is the main module)
# Output: $APPWRAPPER_CACHE_DIR/helm/$HELM_VERSION/helm (default ~/.cache/appwrapper-dispatcher),
# printed on stdout. A few minutes on 2 cores the first time.
set -euo pipefail
version="${HELM_VERSION:-v3.22.0}"
cache="${APPWRAPPER_CACHE_DIR:-$HOME/.cache/appwrapper-dispatcher}"
out="$cache/helm/$version"
if [[ ! -x "$out/helm" ]]; then
  echo "building helm $version" >&2
  start=$SECONDS
  mkdir -p "$out/.gobin"
  # The ldflags of helm's own Makefile: its version, and the Kubernetes version `helm
  # template` and `helm lint` assume (from the client-go it is built with: v0.37 -> 1.37);
  # without them it assumes 1.20.
  gomod="$(go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$gomod")"
  minor="${client_go#v0.}"; minor="${minor%%.*}"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  GOBIN="$out/.gobin" GOFLAGS="${GOFLAGS:--buildvcs=false}" go install -trimpath \
    -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version"
  mv "$out/.gobin/helm" "$out/helm"
  rmdir "$out/.gobin"
  echo "built helm $version in $((SECONDS - start))s" >&2
fi
echo "$out/helm"
