//go:build tools

// Package testenv records the commands that the test environment builds from
// other modules, so that go.mod pins their versions.
package testenv

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
