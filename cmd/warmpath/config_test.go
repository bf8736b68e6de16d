package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped configuration files pass.
func TestConfigCheckGood(t *testing.T) {
	for _, path := range []string{
		"../../deploy/warmpath.example.yaml",
		"../../deploy/compose/warmpath.yaml",
		"../../deploy/compose/warmpath-vllm.yaml",
	} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := configCommand([]string{"check", path}, nil, &stdout, &stderr); err != nil {
				t.Fatalf("config check %s: %v\n%s", path, err, stderr.String())
			}
			if !strings.Contains(stdout.String(), path+": ok") {
				t.Errorf("stdout = %q; want %q", stdout.String(), path+": ok")
			}
		})
	}
}

// An empty file is the embedded setup, which serve accepts.
func TestConfigCheckEmbedded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := configCommand([]string{"check", path}, nil, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "embedded simulated fleet") {
		t.Errorf("stdout = %q; want a note about the embedded fleet", stdout.String())
	}
}

func TestConfigCheckBad(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		want []string // one problem line each, in order
	}{
		{
			name: "every validation error",
			yaml: `listen: nowhere
redis: {url: "http://redis:6379", addrs: ["redis:6379"]}
replicas:
  - {url: "10.0.0.7:8000"}
discovery:
  - {port: 70000}
kv_events: {topology: mesh}
routing: {policy: fastest, block_size: 0}
health: {failures: -1}
auth: {mode: none}
`,
			want: []string{
				"config: listen:",
				"config: redis: set url or addrs, not both",
				`config: redis.url: "http://redis:6379" is not a redis:// or rediss:// URL`,
				`config: replicas[0].url: "10.0.0.7:8000" is not an http(s) URL with a host`,
				"config: discovery[0].dns: empty",
				"config: discovery[0].port: 70000 out of range",
				`config: kv_events.topology: "mesh" is not per-replica or central`,
				`config: routing.policy: "fastest" is not one of`,
				"config: health.failures: -1 is negative",
			},
		},
		{
			name: "unknown and mistyped fields, all of them",
			yaml: "listen: 0.0.0.0:8080\nlisten_addr: x\nrouting:\n  polcy: warmpath\n  block_size: big\n",
			want: []string{
				"line 2: field listen_addr not found in type gateway.Config",
				"line 4: field polcy not found in type routing.Config",
				"line 5: cannot unmarshal !!str `big` into int",
			},
		},
		{
			name: "the fleet's own checks",
			yaml: "auth: {mode: none}\nreplicas:\n  - {url: http://10.0.0.7:8000/v1, kv_events: tcp://10.0.0.7:5557, kv_replay: tcp://10.0.0.7:5557}\n",
			want: []string{"replicas[0].kv_replay: kvevents: with 1 data-parallel ranks", "give the base URL without /v1"},
		},
		{
			name: "environment overrides are checked like serve applies them",
			yaml: "auth: {mode: none}\nredis: {url: redis://redis:6379/0}\nreplicas: [{url: http://10.0.0.7:8000}]\n",
			env:  map[string]string{"WARMPATH_REDIS_ADDRS": "sentinel-0:26379"},
			want: []string{"config: redis: set url or addrs, not both"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			err := configCommand([]string{"check", path}, func(k string) string { return tt.env[k] }, &stdout, &stderr)
			if err == nil {
				t.Fatalf("config check passed; stdout %q", stdout.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("got %d problem lines, want %d:\n%s", len(lines), len(tt.want), stderr.String())
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("problem %d = %q; want it to contain %q", i, lines[i], w)
				}
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "problem") {
				t.Errorf("err = %v; want the file and a problem count", err)
			}
		})
	}
}

func TestConfigCheckUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"lint", "x.yaml"}, {"check"}, {"check", "a.yaml", "b.yaml"}, {"check", "--nope", "a.yaml"}} {
		if err := configCommand(args, nil, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("config %q succeeded; want a usage error", args)
		}
	}
	missing := filepath.Join(t.TempDir(), "none.yaml")
	var stderr bytes.Buffer
	if err := configCommand([]string{"check", missing}, nil, &bytes.Buffer{}, &stderr); err == nil || !strings.Contains(stderr.String(), "no such file") {
		t.Errorf("missing file: err %v, stderr %q", err, stderr.String())
	}
}

// The binary exits 1 on a bad file and 0 on a good one, as CI scripts need.
func TestConfigCheckExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("listen: nowhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "config", "check", bad).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("bad file: err = %v, want exit status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "config: listen:") {
		t.Errorf("bad file output lacks the field:\n%s", out)
	}
	if out, err := exec.Command(bin, "config", "check", "--env=false", "../../deploy/warmpath.example.yaml").CombinedOutput(); err != nil {
		t.Fatalf("example config: %v\n%s", err, out)
	}
}
