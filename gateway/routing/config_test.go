package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
)

// The zero Config takes the documented defaults and validates.
func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if errs := c.Validate(); errs != nil {
		t.Fatalf("defaults: %v; want valid", errs)
	}
	for name, got := range map[string]any{
		"policy": c.Policy, "block_size": c.BlockSize, "session_ttl": c.SessionTTL, "speculative_ttl": c.SpeculativeTTL,
		"tokenizer": c.Tokenizer, "tokenizer_verify_every": c.TokenizerVerifyEvery, "tokenize_cache_bytes": c.TokenizeCacheBytes,
		"index_max_entries": c.IndexMaxEntries, "approx_chunk_bytes": c.ApproxChunkBytes,
	} {
		want := map[string]any{
			"policy": scoring.PolicyWarmpath, "block_size": 16, "session_ttl": DefaultSessionTTL, "speculative_ttl": 2 * time.Second,
			"tokenizer": TokenizerReplicas, "tokenizer_verify_every": 256, "tokenize_cache_bytes": int64(256 << 20),
			"index_max_entries": blockindex.DefaultMaxEntries, "approx_chunk_bytes": 256,
		}[name]
		if got != want {
			t.Errorf("%s = %v; want %v", name, got, want)
		}
	}
	if set := (Config{BlockSize: 64, SpeculativeTTL: -1}).WithDefaults(); set.BlockSize != 64 || set.SpeculativeTTL != -1 {
		t.Errorf("WithDefaults changed set fields: block_size %d, speculative_ttl %v", set.BlockSize, set.SpeculativeTTL)
	}
}

// Each invalid field is reported by its yaml path.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"routing.policy", Config{Policy: "fastest"}},
		{"routing.weights", Config{Weights: map[string]float64{"magic": 1}}},
		{"routing.block_size", Config{BlockSize: 5000}},
		{"routing.tokenize_url", Config{TokenizeURL: "render:8000"}},
		{"routing.tokenizer", Config{Tokenizer: "/models/qwen"}},
		{"routing.tokenizer_dirs", Config{Tokenizer: TokenizerHF}},
		{"routing.tokenize_cache_bytes", Config{TokenizeCacheBytes: -1}},
		{"routing.max_kv_usage", Config{Saturation: scoring.Saturation{MaxKVUsage: 2}}},
	} {
		c := tc.cfg.WithDefaults()
		errs := c.Validate()
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "config: "+tc.field+":") {
			t.Errorf("%s: errors %v; want one naming it", tc.field, errs)
		}
	}
}
