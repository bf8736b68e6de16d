package gateway

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/routing"
	"github.com/warmpath/warmpath/record"
	"github.com/warmpath/warmpath/responses"
	"github.com/warmpath/warmpath/scoring"
)

// The example configuration in deploy/ parses, validates and matches the
// defaults it claims.
func TestExampleConfig(t *testing.T) {
	for _, path := range []string{"../deploy/warmpath.example.yaml", "../deploy/compose/warmpath.yaml"} {
		c, err := LoadConfig(path, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		d := c.withDefaults()
		if err := d.validate(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	c, _ := LoadConfig("../deploy/warmpath.example.yaml", nil)
	def := Config{Replicas: c.Replicas}.withDefaults()
	got := c.withDefaults()
	if got.Routing.MaxInflightPrefillTokens != def.Routing.MaxInflightPrefillTokens ||
		got.Routing.SessionTTL != def.Routing.SessionTTL ||
		got.Routing.SpeculativeTTL != def.Routing.SpeculativeTTL ||
		got.Health != (fleet.HealthConfig{Interval: fleet.DefaultHealthInterval, Timeout: fleet.DefaultHealthTimeout,
			Failures: fleet.DefaultFailureThreshold, ScrapeInterval: fleet.DefaultScrapeInterval, StaleAfter: fleet.DefaultStaleAfter}) ||
		got.Redis.Timeout != def.Redis.Timeout ||
		got.MaxBodyBytes != def.MaxBodyBytes ||
		got.Routing.IndexMaxEntries != def.Routing.IndexMaxEntries ||
		got.Routing.Tokenizer != def.Routing.Tokenizer ||
		got.Routing.TokenizerVerifyEvery != def.Routing.TokenizerVerifyEvery {
		t.Errorf("the example's stated defaults drifted from the code's:\nexample %+v\ncode    %+v", got.Routing, def.Routing)
	}
}

func TestLoadConfigEnv(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("listen: 0.0.0.0:9000\nrouting:\n  policy: least-load\n  session_ttl: 5m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"WARMPATH_POLICY":         "precise-prefix",
		"WARMPATH_REPLICAS":       "http://a:8000|tcp://a:5557|tcp://a:5558, http://b:8000, http://c:8000|tcp://c:5557|tcp://c:5657|2",
		"WARMPATH_KV_CONNECT":     "tcp://relay:5560",
		"WARMPATH_TOKENIZE_URL":   "http://render:8000",
		"WARMPATH_TOKENIZER":      "simulator",
		"WARMPATH_TOKENIZER_DIRS": "Qwen/Qwen3-8B=/models/qwen3, llama=/m/llama",
		"WARMPATH_DEBUG":          "true",
		"WARMPATH_DEV_KEY":        "sk-x",
	}
	c, err := LoadConfig(path, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:9000" || c.Routing.Policy != "precise-prefix" || c.Routing.SessionTTL != 5*time.Minute || !c.Debug || c.DevKey != "sk-x" {
		t.Errorf("config = %+v", c)
	}
	if len(c.Replicas) != 3 || c.Replicas[0].KVEndpoint != "tcp://a:5557" || c.Replicas[0].ReplayEndpoint != "tcp://a:5558" || c.Replicas[1].URL != "http://b:8000" ||
		c.Replicas[2].DataParallelSize != 2 || c.Replicas[0].DataParallelSize != 0 {
		t.Errorf("replicas = %+v", c.Replicas)
	}
	if c.KVEvents.Connect != "tcp://relay:5560" || c.Routing.TokenizeURL != "http://render:8000" || c.Routing.Tokenizer != TokenizerSimulator {
		t.Errorf("kv_events = %+v, tokenize_url = %q, tokenizer = %q", c.KVEvents, c.Routing.TokenizeURL, c.Routing.Tokenizer)
	}
	if d := c.Routing.TokenizerDirs; len(d) != 2 || d["Qwen/Qwen3-8B"] != "/models/qwen3" || d["llama"] != "/m/llama" {
		t.Errorf("tokenizer_dirs = %v", d)
	}
	if _, err := LoadConfig("", func(k string) string {
		if k == "WARMPATH_TOKENIZER_DIRS" {
			return "nodir"
		}
		return ""
	}); err == nil || !strings.Contains(err.Error(), "WARMPATH_TOKENIZER_DIRS") {
		t.Errorf("WARMPATH_TOKENIZER_DIRS=nodir: err = %v", err)
	}
	for _, bad := range []string{"http://a:8000|||x", "http://a:8000|tcp://a:1|tcp://a:2|2|extra"} {
		if _, err := LoadConfig("", func(k string) string {
			if k == "WARMPATH_REPLICAS" {
				return bad
			}
			return ""
		}); err == nil || !strings.Contains(err.Error(), "WARMPATH_REPLICAS") {
			t.Errorf("WARMPATH_REPLICAS=%q: err = %v", bad, err)
		}
	}
	if _, err := LoadConfig(path, func(k string) string {
		if k == "WARMPATH_DEBUG" {
			return "maybe"
		}
		return ""
	}); err == nil || !strings.Contains(err.Error(), "WARMPATH_DEBUG") {
		t.Errorf("bad WARMPATH_DEBUG: err = %v", err)
	}
}

// Invalid configuration fails at start with a message naming the field.
func TestConfigValidationNamesTheField(t *testing.T) {
	good := fleet.ReplicaSpec{URL: "http://a:8000"}
	tests := []struct {
		name  string
		yaml  string
		cfg   Config
		field string
	}{
		{name: "unknown yaml field", yaml: "listen: x\nroutng: {}\n", field: "routng"},
		{name: "bad duration", yaml: "routing:\n  session_ttl: soon\n", field: "soon"},
		{name: "bad listen", cfg: Config{Listen: "nope", Replicas: []fleet.ReplicaSpec{good}}, field: "listen"},
		{name: "bad replica url", cfg: Config{Replicas: []fleet.ReplicaSpec{good, {URL: "10.0.0.7:8000"}}}, field: "replicas[1].url"},
		{name: "duplicate replica", cfg: Config{Replicas: []fleet.ReplicaSpec{good, good}}, field: "replicas[1].name"},
		{name: "bad kv endpoint", cfg: Config{Replicas: []fleet.ReplicaSpec{{URL: "http://a:1", KVEndpoint: "10.0.0.7:5557"}}}, field: "replicas[0].kv_events"},
		{name: "bad policy", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Policy: "fastest"}}, field: "routing.policy"},
		{name: "bad weight", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Weights: map[string]float64{"magic": 1}}}, field: "routing.weights"},
		{name: "bad topology", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, KVEvents: KVEventsConfig{Topology: "mesh"}}, field: "kv_events.topology"},
		{name: "bad redis url", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Redis: RedisConfig{URL: "http://redis"}}, field: "redis.url"},
		{name: "redis url and addrs", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Redis: RedisConfig{URL: "redis://r:6379", Addrs: []string{"r:6379"}}}, field: "redis"},
		{name: "wp- dev key", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, DevKey: "wp-abcdefabcdef0123456789"}, field: "dev_key"},
		{name: "brace in key prefix", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Redis: RedisConfig{Addrs: []string{"r:6379"}, KeyPrefix: "{wp}:"}}, field: "redis.key_prefix"},
		{name: "cluster without addrs", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Redis: RedisConfig{URL: "redis://r:6379", Cluster: true}}, field: "redis.cluster"},
		{name: "cluster with master name", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Redis: RedisConfig{Addrs: []string{"s:26379"}, MasterName: "m", Cluster: true}}, field: "redis.cluster"},
		{name: "discovery without port", cfg: Config{Discovery: []fleet.DNSSpec{{Name: "vllm"}}}, field: "discovery[0].port"},
		{name: "bad block size", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{BlockSize: -1}}, field: "routing.block_size"},
		{name: "bad kv usage", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Saturation: scoring.Saturation{MaxKVUsage: 2}}}, field: "routing.max_kv_usage"},
		{name: "bad sim", cfg: Config{Sim: SimConfig{Replicas: 500}}, field: "sim.replicas"},
		{name: "negative health failures", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Health: fleet.HealthConfig{Failures: -1}}, field: "health.failures"},
		{name: "negative record keep", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Record: record.Config{Dir: "r", Keep: -1}}, field: "record.keep"},
		{name: "negative responses ttl", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Responses: responses.Config{TTL: -1}}, field: "responses.ttl"},
		{name: "rank 1 events on the replay port", cfg: Config{Replicas: []fleet.ReplicaSpec{{URL: "http://a:1", KVEndpoint: "tcp://a:5557",
			ReplayEndpoint: "tcp://a:5558", DataParallelSize: 2}}}, field: "replicas[0].kv_replay: kvevents: with 2 data-parallel ranks"},
		{name: "ranks past the last port", cfg: Config{Replicas: []fleet.ReplicaSpec{{URL: "http://a:1", KVEndpoint: "tcp://a:65535",
			DataParallelSize: 2}}}, field: "replicas[0].kv_events"},
		{name: "discovery ports overlap", cfg: Config{Discovery: []fleet.DNSSpec{{Name: "vllm", Port: 8000, KVPort: 5557, ReplayPort: 5558,
			DataParallelSize: 4}}}, field: "discovery[0].replay_port: kvevents: with 4 data-parallel ranks"},
		{name: "bind and connect", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, KVEvents: KVEventsConfig{Topology: TopologyCentral,
			Bind: "tcp://*:5557", Connect: "tcp://relay:5560"}}, field: "kv_events: set bind"},
		{name: "connect per replica", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, KVEvents: KVEventsConfig{Connect: "tcp://relay:5560"}},
			field: "kv_events.connect"},
		{name: "bad kv topic", cfg: Config{Replicas: []fleet.ReplicaSpec{{URL: "http://a:1", KVTopic: "kv@a b@m"}}}, field: "replicas[0].kv_topic"},
		{name: "bad tokenize url", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{TokenizeURL: "render:8000"}},
			field: "routing.tokenize_url"},
		{name: "bad tokenizer", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Tokenizer: "/models/qwen"}},
			field: "routing.tokenizer"},
		{name: "hf without dirs", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Tokenizer: TokenizerHF}},
			field: "routing.tokenizer_dirs"},
		{name: "dirs without hf", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{TokenizerDirs: map[string]string{"m": "/d"}}},
			field: "routing.tokenizer_dirs"},
		{name: "empty tokenizer dir", cfg: Config{Replicas: []fleet.ReplicaSpec{good}, Routing: routing.Config{Tokenizer: TokenizerHF,
			TokenizerDirs: map[string]string{"m": ""}}}, field: "routing.tokenizer_dirs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.yaml != "" {
				path := filepath.Join(t.TempDir(), "c.yaml")
				os.WriteFile(path, []byte(tt.yaml), 0o600)
				_, err = LoadConfig(path, nil)
			} else {
				c := tt.cfg.withDefaults()
				err = c.validate()
			}
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("err = %v; want one naming %q", err, tt.field)
			}
		})
	}
	if _, err := New(Config{}, Options{}); err == nil {
		t.Error("New with no fleet succeeded")
	}
	missing := engineConfig(scoring.PolicyPrecisePrefix, good)
	missing.Routing.Tokenizer, missing.Routing.TokenizerDirs = TokenizerHF, map[string]string{"qwen": t.TempDir()}
	if _, err := New(missing, Options{}); err == nil || !strings.Contains(err.Error(), `routing.tokenizer_dirs["qwen"]`) ||
		!strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("New with no tokenizer.json: err = %v; want one naming the model and the file", err)
	}
}

// A configuration that still sets the removed prefix claims' setting
// loads, with a warning that names it; one that does not warns nothing.
func TestDeprecatedClaimMinTokensWarns(t *testing.T) {
	for _, set := range []int{0, 1024} {
		var buf bytes.Buffer
		c := Config{Routing: routing.Config{ClaimMinTokens: set}}
		c.warnDeprecated(slog.New(slog.NewTextHandler(&buf, nil)))
		if got := strings.Contains(buf.String(), "routing.claim_min_tokens is ignored"); got != (set != 0) {
			t.Errorf("claim_min_tokens %d: warned %v: %q", set, got, buf.String())
		}
	}
}
