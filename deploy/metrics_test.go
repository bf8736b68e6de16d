package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	// Series registered by full name: prometheus.CounterOpts{Name: …} and
	// prometheus.NewDesc(…).
	fullName = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(warmpath_[a-z0-9_]+)"`)
	// Series registered as Namespace "warmpath" + Subsystem: their names
	// are the Name fields and the first argument of the file's helper.
	subsystem = regexp.MustCompile(`Namespace:\s*"warmpath",\s*Subsystem:\s*"([a-z0-9_]+)"`)
	subName   = regexp.MustCompile(`(?:Name:\s*|counter\(\s*)"([a-z0-9_]+)"`)
)

// registeredSeries scans the module's non-test Go files for the warmpath_*
// series they register.
func registeredSeries(t *testing.T) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		src := string(b)
		for _, m := range fullName.FindAllStringSubmatch(src, -1) {
			names = append(names, m[1])
		}
		if sub := subsystem.FindStringSubmatch(src); sub != nil {
			for _, m := range subName.FindAllStringSubmatch(src, -1) {
				if !strings.HasPrefix(m[1], "warmpath_") {
					names = append(names, "warmpath_"+sub[1]+"_"+m[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// The metrics reference (docs/reference/metrics.md) names every series the
// code registers.
func TestMetricsReference(t *testing.T) {
	names := registeredSeries(t)
	if len(names) < 40 {
		t.Fatalf("found only %d registered series; the scan is broken: %v", len(names), names)
	}
	table := mustRead(t, "../docs/reference/metrics.md")
	if !strings.HasPrefix(table, "# Metrics\n") {
		t.Fatal("docs/reference/metrics.md does not start with its Metrics heading")
	}
	for _, n := range names {
		if !strings.Contains(table, "`"+n+"`") {
			t.Errorf("docs/reference/metrics.md's table does not name %s", n)
		}
	}
}
