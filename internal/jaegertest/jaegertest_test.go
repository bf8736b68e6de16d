package jaegertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tool module, .ci/run and JaegerVersion name the same release.
func TestVersionAgrees(t *testing.T) {
	td, err := toolDir()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(td, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "github.com/jaegertracing/jaeger " + JaegerVersion; !strings.Contains(string(mod), want) {
		t.Errorf("tool/go.mod does not require %s:\n%s", want, mod)
	}
	ci, err := os.ReadFile(filepath.Join(td, "..", "..", "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "jaeger-" + JaegerVersion; !strings.Contains(string(ci), want) {
		t.Errorf(".ci/run does not build %s", want)
	}
	if !strings.Contains(string(mod), "tool github.com/jaegertracing/jaeger/cmd/jaeger") {
		t.Errorf("tool/go.mod has no tool directive for cmd/jaeger:\n%s", mod)
	}
}
