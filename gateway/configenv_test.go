package gateway

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/tenancy"
)

var update = flag.Bool("update", false, "rewrite the generated reference pages (environment, config fields, metrics) instead of comparing them")

// One derived variable of every kind sets its field.
func TestEnvDerived(t *testing.T) {
	tests := []struct {
		env, value string
		check      func(c Config) bool
	}{
		{"WARMPATH_ROUTING_POLICY", "least-load", func(c Config) bool { return c.Routing.Policy == "least-load" }},
		{"WARMPATH_QUEUE_VLLM_PRIORITY", "true", func(c Config) bool { return c.Queue.VLLMPriority }},
		{"WARMPATH_REDIS_DB", "3", func(c Config) bool { return c.Redis.DB == 3 }},
		{"WARMPATH_MAX_BODY_BYTES", "1048576", func(c Config) bool { return c.MaxBodyBytes == 1<<20 }},
		{"WARMPATH_QUEUE_BACKGROUND_SHARE", "0.25", func(c Config) bool { return c.Queue.BackgroundShare == 0.25 }},
		{"WARMPATH_ROUTING_SESSION_TTL", "1m30s", func(c Config) bool { return c.Routing.SessionTTL == 90*time.Second }},
		{"WARMPATH_REDIS_ADDRS", "a:26379, b:26379,", func(c Config) bool { return reflect.DeepEqual(c.Redis.Addrs, []string{"a:26379", "b:26379"}) }},
		{"WARMPATH_ROUTING_TOKENIZER_DIRS", "m=/d, org/n=/e", func(c Config) bool {
			return reflect.DeepEqual(c.Routing.TokenizerDirs, map[string]string{"m": "/d", "org/n": "/e"})
		}},
		{"WARMPATH_ROUTING_WEIGHTS", "prefix=2,kv=0.5", func(c Config) bool {
			return reflect.DeepEqual(c.Routing.Weights, map[string]float64{"prefix": 2, "kv": 0.5})
		}},
		// Several levels deep, and through the inline scoring.Saturation.
		{"WARMPATH_QUEUE_SATURATION_RESERVE_IDLE", "250ms", func(c Config) bool { return c.Queue.Saturation.ReserveIdle == 250*time.Millisecond }},
		{"WARMPATH_AUTH_REDIS_FAILURE_CONCURRENCY", "closed", func(c Config) bool { return c.Auth.RedisFailure.Concurrency == "closed" }},
		{"WARMPATH_ROUTING_MAX_INFLIGHT_PREFILL_TOKENS", "-1", func(c Config) bool { return c.Routing.MaxInflightPrefillTokens == -1 }},
		// Aliases.
		{"WARMPATH_REDIS_MASTER", "mymaster", func(c Config) bool { return c.Redis.MasterName == "mymaster" }},
		{"WARMPATH_ADMIN_KEY", "adm", func(c Config) bool { return c.Auth.AdminKey == "adm" }},
		// The exceptions table.
		{"WARMPATH_DISCOVERY", "[{dns: vllm, port: 8000, interval: 5s}]", func(c Config) bool {
			return reflect.DeepEqual(c.Discovery, []fleet.DNSSpec{{Name: "vllm", Port: 8000, Interval: 5 * time.Second}})
		}},
		{"WARMPATH_AUTH_JWT_KEYS", "[{kid: k1, alg: HS256, secret_file: /s/k1}]", func(c Config) bool {
			return reflect.DeepEqual(c.Auth.JWT.Keys, []tenancy.JWTKeyConfig{{KID: "k1", Alg: "HS256", SecretFile: "/s/k1"}})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			c, err := LoadConfig("", func(k string) string {
				if k == tt.env {
					return tt.value
				}
				return ""
			})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("%s=%q: config = %+v", tt.env, tt.value, c)
			}
		})
	}
}

// Every variable LoadConfig read before the names were derived still sets
// the same field.
func TestEnvAliasesKeepOldNames(t *testing.T) {
	old := map[string]string{
		"WARMPATH_LISTEN": "listen", "WARMPATH_METRICS_LISTEN": "metrics_listen",
		"WARMPATH_REDIS_URL": "redis.url", "WARMPATH_REDIS_KEY_PREFIX": "redis.key_prefix",
		"WARMPATH_POLICY": "routing.policy", "WARMPATH_KV_TOPOLOGY": "kv_events.topology",
		"WARMPATH_KV_BIND": "kv_events.bind", "WARMPATH_KV_CONNECT": "kv_events.connect",
		"WARMPATH_TOKENIZE_URL": "routing.tokenize_url", "WARMPATH_TOKENIZER": "routing.tokenizer",
		"WARMPATH_TOKENIZER_DIRS": "routing.tokenizer_dirs", "WARMPATH_DEV_KEY": "dev_key",
		"WARMPATH_AUTH_MODE": "auth.mode", "WARMPATH_ADMIN_KEY": "auth.admin_key",
		"WARMPATH_SALT_SECRET": "auth.salt_secret", "WARMPATH_REDIS_ADDRS": "redis.addrs",
		"WARMPATH_REDIS_MASTER": "redis.master_name", "WARMPATH_REDIS_CLUSTER": "redis.cluster",
		"WARMPATH_DEBUG": "debug", "WARMPATH_REPLICAS": "replicas",
		"WARMPATH_SIM_REPLICAS": "sim.replicas", "WARMPATH_SIM_SPEED": "sim.speed",
	}
	byName := map[string]string{}
	for _, ev := range envVars() {
		for _, n := range append([]string{ev.Name}, ev.Aliases...) {
			byName[n] = ev.Path
		}
	}
	for name, path := range old {
		if byName[name] != path {
			t.Errorf("%s sets %q; want %q", name, byName[name], path)
		}
	}
}

// Every yaml leaf of Config has a variable with a format, and no two
// variables (derived names, aliases, the command's own) share a name.
func TestEnvCoversConfig(t *testing.T) {
	seen := map[string]string{}
	for n := range envReserved {
		seen[n] = "read by cmd/warmpath"
	}
	claim := func(name, path string) {
		if other, ok := seen[name]; ok {
			t.Errorf("%s names both %s and %s", name, other, path)
		}
		seen[name] = path
	}
	paths := map[string]bool{}
	for _, ev := range envVars() {
		paths[ev.Path] = true
		if ev.Type == "" {
			t.Errorf("%s (%s): no environment format for its type", ev.Name, ev.Path)
		}
		claim(ev.Name, ev.Path)
		for _, a := range ev.Aliases {
			claim(a, ev.Path)
		}
	}
	for p := range envAliases {
		if !paths[p] {
			t.Errorf("envAliases names %s, which is no yaml field", p)
		}
	}
	for p := range envSpecial {
		if !paths[p] {
			t.Errorf("envSpecial names %s, which is no yaml field", p)
		}
	}
	// The leaves the yaml decoder knows: every one must have a variable.
	for _, p := range yamlLeaves(reflect.TypeFor[Config](), "") {
		if !paths[p] {
			t.Errorf("yaml field %s has no environment variable", p)
		}
	}
}

// yamlLeaves lists the yaml paths of t's fields that are not structs, and
// of struct-typed ones whose elements the walker does not reach (slices and
// maps), independently of walkEnv.
func yamlLeaves(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			out = append(out, yamlLeaves(f.Type, prefix)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, yamlLeaves(f.Type, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}

// A bad value names the variable (the one set, alias or not) and the path;
// an alias and its derived name set to different values is an error naming
// both, and to the same value is not.
func TestEnvBadValue(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"WARMPATH_ROUTING_SESSION_TTL": "soon"},
			`config: WARMPATH_ROUTING_SESSION_TTL (routing.session_ttl): time: invalid duration "soon"`},
		{map[string]string{"WARMPATH_REDIS_DB": "one"}, `config: WARMPATH_REDIS_DB (redis.db): strconv.ParseInt: parsing "one": invalid syntax`},
		{map[string]string{"WARMPATH_ROUTING_WEIGHTS": "kv=lots"}, `config: WARMPATH_ROUTING_WEIGHTS (routing.weights): kv: strconv.ParseFloat`},
		{map[string]string{"WARMPATH_TOKENIZER_DIRS": "nodir"}, `config: WARMPATH_TOKENIZER_DIRS (routing.tokenizer_dirs): "nodir" is not key=value`},
		{map[string]string{"WARMPATH_DISCOVERY": "[{dns: vllm, prot: 8000}]"}, `config: WARMPATH_DISCOVERY (discovery): yaml: unmarshal errors`},
		{map[string]string{"WARMPATH_POLICY": "least-load", "WARMPATH_ROUTING_POLICY": "warmpath"},
			"config: WARMPATH_ROUTING_POLICY (routing.policy): WARMPATH_POLICY is also set, to a different value"},
	}
	for _, tt := range tests {
		_, err := LoadConfig("", func(k string) string { return tt.env[k] })
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v; want one containing %q", tt.env, err, tt.want)
		}
	}
	both := map[string]string{"WARMPATH_POLICY": "least-load", "WARMPATH_ROUTING_POLICY": "least-load"}
	if c, err := LoadConfig("", func(k string) string { return both[k] }); err != nil || c.Routing.Policy != "least-load" {
		t.Errorf("alias and name set alike: policy %q, err %v", c.Routing.Policy, err)
	}
	// Every bad value is reported, not only the first.
	two := map[string]string{"WARMPATH_DEBUG": "maybe", "WARMPATH_SIM_SPEED": "fast"}
	if _, err := LoadConfig("", func(k string) string { return two[k] }); err == nil ||
		!strings.Contains(err.Error(), "WARMPATH_DEBUG") || !strings.Contains(err.Error(), "WARMPATH_SIM_SPEED") {
		t.Errorf("two bad values: err = %v", err)
	}
}

const envReferencePage = "../docs/reference/environment.md"

// The committed reference page is what EnvReference writes.
func TestEnvironmentReference(t *testing.T) {
	var b bytes.Buffer
	if err := EnvReference(&b); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(envReferencePage, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(envReferencePage)
	if err != nil || !bytes.Equal(got, b.Bytes()) {
		t.Errorf("%s is not what gateway.EnvReference writes (%v); regenerate it with\n\tgo test ./gateway -run TestEnvironmentReference -update", envReferencePage, err)
	}
}

// envSize reads "<n>KiB" as a text scalar; envLevel reads a yaml scalar.
// No Config field has such a type yet: these check the walker would read one.
type (
	envSize  int64
	envLevel struct{ name string }
)

func (s *envSize) UnmarshalText(b []byte) error {
	n, ok := strings.CutSuffix(string(b), "KiB")
	if !ok {
		return fmt.Errorf("%q is not <n>KiB", b)
	}
	v, err := strconv.ParseInt(n, 10, 64)
	*s = envSize(v << 10)
	return err
}

func (l *envLevel) UnmarshalYAML(n *yaml.Node) error { return n.Decode(&l.name) }

func TestEnvCustomScalars(t *testing.T) {
	var x struct {
		Size  envSize  `yaml:"size"`
		Level envLevel `yaml:"level"`
	}
	v := reflect.ValueOf(&x).Elem()
	if !isEnvScalar(v.Field(0).Type()) || !isEnvScalar(v.Field(1).Type()) {
		t.Fatal("custom scalar types are not scalars to the walker")
	}
	if err := setEnvScalar(v.Field(0), "4KiB"); err != nil || x.Size != 4096 {
		t.Errorf("size = %d, err %v", x.Size, err)
	}
	if err := setEnvScalar(v.Field(1), "warn"); err != nil || x.Level.name != "warn" {
		t.Errorf("level = %q, err %v", x.Level.name, err)
	}
	if err := setEnvScalar(v.Field(0), "4MB"); err == nil {
		t.Error("size 4MB: no error")
	}
}
