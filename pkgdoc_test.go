package warmpath_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs fails when a package of this module has no package doc
// comment, or has it in more than one file.
func TestPackageDocs(t *testing.T) {
	dirs := map[string][]string{} // dir → non-test Go files
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no packages found")
	}
	fset := token.NewFileSet()
	for dir, files := range dirs {
		var withDoc []string
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(fset, f, src, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
				withDoc = append(withDoc, f)
			}
		}
		switch len(withDoc) {
		case 0:
			t.Errorf("package in %s has no package doc comment", dir)
		case 1:
		default:
			t.Errorf("package in %s has a package doc comment in %d files: %v (keep one, in doc.go)", dir, len(withDoc), withDoc)
		}
	}
}
