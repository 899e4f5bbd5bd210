#!/usr/bin/env bash
# Prints the `replace` block that pins every k8s.io staging module that
# k8s.io/kubernetes $1 points at ./staging to its published v0.<minor>.<patch>.
# k8s.io/kubernetes cannot be consumed without it: its go.mod requires the
# staging modules at v0.0.0 and resolves them through local paths.
set -euo pipefail
k8s_version="${1:?usage: gen-replaces.sh v1.36.3}"
staging_version="v0.${k8s_version#v1.}"
proxy="$(go env GOPROXY)"; proxy="${proxy%%,*}"
proxy="${proxy:-https://proxy.golang.org}"
echo "replace ("
curl -fsSL "${proxy}/k8s.io/kubernetes/@v/${k8s_version}.mod" |
  awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' |
  while read -r module; do
    if curl -fsS -o /dev/null "${proxy}/${module}/@v/${staging_version}.info" 2>/dev/null; then
      printf '\t%s => %s %s\n' "$module" "$module" "$staging_version"
    else
      echo "# not published at ${staging_version}: ${module}" >&2
    fi
  done
echo ")"
