package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// adminGuide is the page whose admin examples TestServeEmbedded runs.
const adminGuide = "../../docs/guides/tenants-and-keys.md"

// runAdminGuide runs the admin examples of the tenants-and-keys guide, as
// written, against a serving gateway: every curl line of its first sh
// block (with U pointed at base and <id> the key the block issues), then
// every `warmpath admin …` command its text names (for a second tenant,
// acme-cli, since the curl lines made acme). Each must succeed with JSON.
func runAdminGuide(t *testing.T, ctx context.Context, bin, base, adminKey string) {
	t.Helper()
	b, err := os.ReadFile(adminGuide)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("%s: no sh block", adminGuide)
	}
	lines := strings.Split(strings.TrimSpace(m[1]), "\n")
	prelude := strings.ReplaceAll(lines[0], "http://localhost:8080", base)
	comment := regexp.MustCompile(`\s+#\s.*$`)
	id, ran := "", 0
	for _, line := range lines[1:] {
		line = comment.ReplaceAllString(line, "")
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		line = strings.ReplaceAll(line, "<id>", id)
		cmd := exec.CommandContext(ctx, "bash", "-c", prelude+"\n"+line+` -w '\n%{http_code}'`)
		cmd.Env = append(os.Environ(), "WARMPATH_ADMIN_KEY="+adminKey)
		out, err := cmd.Output()
		body, code := "", ""
		if i := strings.LastIndexByte(string(out), '\n'); i >= 0 { // -w put the status last
			body, code = string(out)[:i], strings.TrimSpace(string(out)[i+1:])
		}
		if err != nil || !strings.HasPrefix(code, "2") || !json.Valid([]byte(body)) {
			t.Fatalf("%s\n-> %s %s (%v)", line, code, body, err)
		}
		var v struct {
			ID     string `json:"id"`
			APIKey string `json:"api_key"`
		}
		if json.Unmarshal([]byte(body), &v) == nil && v.APIKey != "" {
			id = v.ID // the issued key's id, for rotate and revoke
		}
		ran++
	}
	if ran < 5 || id == "" {
		t.Fatalf("%s: ran %d curl lines, key id %q; want the whole block and an issued key", adminGuide, ran, id)
	}
	flat := strings.Join(strings.Fields(doc), " ")
	cli := regexp.MustCompile("`warmpath admin ([^`…]+)`").FindAllStringSubmatch(flat, -1)
	if len(cli) == 0 {
		t.Fatalf("%s: no warmpath admin command", adminGuide)
	}
	for _, c := range cli {
		args := strings.Fields(strings.NewReplacer("--id acme", "--id acme-cli", "--tenant acme", "--tenant acme-cli").Replace(c[1]))
		cmd := exec.CommandContext(ctx, bin, append([]string{"admin", "--url", base}, args...)...)
		cmd.Env = append(os.Environ(), "WARMPATH_ADMIN_KEY="+adminKey)
		out, err := cmd.CombinedOutput()
		if err != nil || !json.Valid(out) {
			t.Fatalf("warmpath admin %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
