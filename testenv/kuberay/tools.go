//go:build tools

// Package kuberay pins the KubeRay operator. It lives in a module of its own
// because it is built against an older controller-runtime than KWOK needs.
package kuberay

import (
	_ "github.com/ray-project/kuberay/ray-operator"
)
