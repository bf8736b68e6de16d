package warmpath_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks fails on any relative link in README.md or docs/**/*.md
// that names a missing file, or a #anchor that no heading (or <a id/name>)
// of its target defines, with GitHub's anchor rules. Files under
// docs/benchmarks/log/ are verbatim history: links inside them are not
// checked (links to them are).
func TestDocLinks(t *testing.T) {
	files := []string{"README.md"}
	err := filepath.WalkDir("docs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // file → its anchors
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil
		}
		a := docAnchors(string(b))
		anchors[file] = a
		return a
	}
	checked := 0
	for _, file := range files {
		if strings.HasPrefix(file, "docs/benchmarks/log/") {
			continue // verbatim history
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range docLinks(string(b)) {
			checked++
			target, frag, _ := strings.Cut(l.target, "#")
			resolved := file
			if target != "" {
				if strings.HasPrefix(target, "/") {
					resolved = path.Clean(strings.TrimPrefix(target, "/"))
				} else {
					resolved = path.Join(path.Dir(file), target)
				}
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s:%d: link to missing file %q", file, l.line, l.target)
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if !anchorsOf(resolved)[frag] {
				t.Errorf("%s:%d: link %q: %s has no anchor #%s", file, l.line, l.target, resolved, frag)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d links; the scan is broken", checked)
	}
}

type docLink struct {
	target string
	line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// docLinks returns the relative link targets of a Markdown text, outside
// code blocks and code spans.
func docLinks(text string) []docLink {
	var out []docLink
	for i, line := range proseLines(text) {
		if line == "" {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, tg := range targets {
			tg = strings.Trim(tg, "<>")
			if tg == "" || strings.Contains(tg, "://") || strings.HasPrefix(tg, "mailto:") {
				continue
			}
			out = append(out, docLink{tg, i + 1})
		}
	}
	return out
}

// proseLines returns text's lines with those inside fenced code blocks
// (and the fences themselves) blanked, so index i is line i+1.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, line := range lines {
		if f, ok := fenceMarker(line); ok {
			switch {
			case fence == "":
				fence = f
			case strings.HasPrefix(f, fence[:1]) && len(f) >= len(fence):
				fence = ""
			}
			lines[i] = ""
			continue
		}
		if fence != "" {
			lines[i] = ""
		}
	}
	return lines
}

func fenceMarker(line string) (string, bool) {
	s := strings.TrimLeft(line, " ")
	if len(line)-len(s) > 3 {
		return "", false
	}
	for _, c := range []string{"```", "~~~"} {
		if strings.HasPrefix(s, c) {
			n := len(s) - len(strings.TrimLeft(s, c[:1]))
			return s[:n], true
		}
	}
	return "", false
}

// docAnchors returns the anchors GitHub gives a Markdown text's headings
// (lowercased, spaces to '-', punctuation other than '-' and '_'
// dropped, repeats suffixed -1, -2, …) and its <a id/name> tags.
func docAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		s := strings.TrimLeft(line, " ")
		if len(line)-len(s) > 3 || !strings.HasPrefix(s, "#") {
			continue
		}
		h := strings.TrimLeft(s, "#")
		if len(s)-len(h) > 6 || (h != "" && h[0] != ' ' && h[0] != '\t') {
			continue
		}
		a := githubAnchor(h)
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			a = a + "-" + strconv.Itoa(n+1)
		} else {
			seen[a] = 0
		}
		out[a] = true
	}
	return out
}

var mdLinkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

func githubAnchor(heading string) string {
	h := strings.TrimSpace(heading)
	h = strings.TrimSpace(strings.TrimRight(h, "#")) // closing hashes
	h = mdLinkText.ReplaceAllString(h, "$1")
	var sb strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			sb.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// The anchor rules on headings this repository uses.
func TestGithubAnchor(t *testing.T) {
	for h, want := range map[string]string{
		"Anthropic Messages API (Claude Code)":         "anthropic-messages-api-claude-code",
		"The gateway's own cost (`warmpath overhead`)": "the-gateways-own-cost-warmpath-overhead",
		"Health, readiness and shutdown":               "health-readiness-and-shutdown",
		"Data: the Mooncake trace":                     "data-the-mooncake-trace",
		"0.24 – 0.25 snake_case":                       "024--025-snake_case",
	} {
		if got := githubAnchor(h); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestDevelopmentLayout keeps the package map in docs/development.md
// honest: every folder it lists exists, and every package folder of the
// module and every top-level folder is listed.
func TestDevelopmentLayout(t *testing.T) {
	b, err := os.ReadFile("docs/development.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("docs/development.md has no Layout section")
	}
	_, block, ok := strings.Cut(after, "```\n")
	if ok {
		block, _, ok = strings.Cut(block, "\n```")
	}
	if !ok {
		t.Fatal("docs/development.md's Layout section has no code block")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(block, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || line[0] == ' ' || !strings.HasSuffix(f[0], "/") {
			continue
		}
		dir := strings.TrimSuffix(f[0], "/")
		listed[dir] = true
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Errorf("docs/development.md lists %s/, which is not a folder", dir)
		}
	}
	want := map[string]bool{}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			want[e.Name()] = true
		}
	}
	err = filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if dir := filepath.ToSlash(filepath.Dir(p)); dir != "." && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			want[dir] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range want {
		if listed[dir] {
			continue
		}
		// A top-level folder is covered by its listed subfolders.
		covered := false
		for l := range listed {
			if strings.HasPrefix(l, dir+"/") {
				covered = true
			}
		}
		if !covered {
			t.Errorf("docs/development.md's layout does not list %s/", dir)
		}
	}
}
