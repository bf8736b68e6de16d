// Package nodeclients finds what the real-client tests need: node on PATH
// and the pinned npm clients installed under clients/node_modules. It is
// the one copy of that lookup the gateway and responses tests share. It
// keeps no state and runs no goroutines.
package nodeclients

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Find returns node's path and the clients directory (root/clients, root
// relative to the test's package). It skips the test when either is
// missing, except under CI=true, where it fails: CI must run them.
func Find(t testing.TB, root string) (node, dir string) {
	t.Helper()
	missing := func(format string, args ...any) {
		if os.Getenv("CI") == "true" {
			t.Fatalf(format+" (CI=true: the real-client tests must run; see .ci/run)", args...)
		}
		t.Skipf(format, args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	dir, _ = filepath.Abs(filepath.Join(root, "clients"))
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		missing("clients/node_modules is missing: run npm ci --prefix clients")
	}
	return node, dir
}
