package routing

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/scoring/blockindex"
)

// Config is the routing: block of the gateway's configuration: the
// policy and its knobs, the prefix indexes, the tokenizer and the session
// bindings. The zero value is valid after WithDefaults: the warmpath
// policy, 16-token blocks, the replicas' /tokenize.
type Config struct {
	// Policy is one of round-robin, least-load, session-hash,
	// approx-prefix, precise-prefix, warmpath (default).
	Policy string `yaml:"policy"`
	// Weights overrides scorer weights by name: prefix, session, queue,
	// kv, inflight. warmpath, which routes by estimated time to first
	// token, takes none.
	Weights map[string]float64 `yaml:"weights"`
	// BlockSize is the prefix index's block size in tokens; default 16.
	// It need not equal the engines' block size.
	BlockSize int `yaml:"block_size"`
	// SessionTTL is how long a session binding outlives its last turn;
	// default 30m.
	SessionTTL time.Duration `yaml:"session_ttl"`
	// SessionLocalTrust is how long after this gateway last read a
	// session's binding from Redis (or wrote it there) its next turns are
	// routed on the in-process copy without asking Redis: how late a
	// change by another gateway (a rebind, a completed turn's cached
	// tokens) is seen here. Default 0: every turn asks Redis. Set it (1s,
	// say) when each session's turns reach one gateway (a single gateway,
	// or a load balancer keyed on the session): when gateways take one
	// session's turns in turn, each copy misses the others' completed
	// turns and the estimated policy rebinds on stale cached-token counts
	// (TestRollingRestart moved sessions in 2 of 4 runs at 1s, in none of
	// 4 at 0).
	SessionLocalTrust time.Duration `yaml:"session_local_trust"`
	// BindingWriteSpacing is the least time between two of this
	// gateway's batched binding writes to Redis: bindings made within one
	// spacing share one pipelined write, and a binding made after a quiet
	// spacing is written at once. Other gateways see a new binding up to
	// this much later (this one serves it from memory meanwhile). Unset:
	// 20ms while this gateway sees no other, 5ms while it does (the
	// queue's backlog exchange sees them), since a session's next turn may
	// then reach another gateway right after this turn ends; negative
	// writes as soon as the last write returned.
	BindingWriteSpacing time.Duration `yaml:"binding_write_spacing"`
	// SpeculativeTTL is how long a routing decision's predicted blocks
	// count as cached before the engine's events confirm them (up to
	// 250 ms longer: their expiry is left to the KV-event path for that
	// long, see matchGrace); default 2s, negative disables speculative
	// entries.
	SpeculativeTTL time.Duration `yaml:"speculative_ttl"`
	// ClaimMinTokens is accepted and ignored. Deprecated: prefix claims
	// between gateways were removed (2026-12-06): their benefit, +0.24
	// points of cached prefix over eleven paired two-gateway runs, was
	// inside the pairs' run-to-run spread (standard deviation 0.85), and
	// they changed 8 of 159 decisions. A configuration that sets it loads
	// with a warning.
	ClaimMinTokens int `yaml:"claim_min_tokens"`
	// Saturation (max_waiting, max_kv_usage, max_inflight_prefill_tokens)
	// marks a replica saturated (reported in metrics and debug output;
	// warmpath weighs the load itself instead).
	// Defaults 32 waiting, KV use 1.0 (a completely full cache) and
	// 262,144 in-flight prefill tokens from this gateway (about 17 s of
	// prefill at 15,000 tokens/s); negative disables a threshold. See
	// scoring.Saturation.
	scoring.Saturation `yaml:",inline"`
	// SkipUnseen makes the precise policies route a prompt whose opening
	// (its first approx_chunk_bytes of text) this gateway never sent to
	// any replica on load, without the tokenizer round trip, and tokenize
	// it off the request path (tips.go): no replica can hold a prefix of
	// it unless another gateway sent it, or this one restarted since. The
	// default, false, tokenizes every prompt that is not sticky: on the
	// shared-prefix benchmark skipping cost 1.3 points of cached fraction
	// (84.5 % against 85.9 %, medians of 6 and 4 runs), because a prompt's
	// blocks are speculated only once its tokenization lands.
	SkipUnseen bool `yaml:"skip_unseen"`
	// TokenizeCacheBytes bounds the cache of tokenized prompts by the
	// bytes their token ids take (4 a token, plus about 100 an entry);
	// default 256 MiB, about 16,000 prompts of 4,096 tokens.
	TokenizeCacheBytes int64 `yaml:"tokenize_cache_bytes"`
	// IndexMaxEntries bounds the precise index in (block, replica)
	// entries; default blockindex.DefaultMaxEntries (16 Mi, about 0.8 GiB
	// at the measured 48.7 bytes per entry; size a container's memory
	// limit above it).
	IndexMaxEntries int `yaml:"index_max_entries"`
	// ApproxChunkBytes is the approximate index's chunk size; default 256.
	ApproxChunkBytes int `yaml:"approx_chunk_bytes"`
	// TokenizeURL, when set, is the base URL (without /tokenize) of a
	// tokenizer service that answers vLLM's POST /tokenize, such as a vLLM
	// render or tokenize-only server, asked before any replica. Empty
	// means the replicas tokenize.
	TokenizeURL string `yaml:"tokenize_url"`
	// Tokenizer picks where token ids come from first: "replicas" (the
	// default, also "") asks the replicas' (or tokenize_url's) /tokenize;
	// "simulator" tokenizes in process with the simulated model's
	// vocabulary and chat template (simtok.TokenizeBody, the simulator's
	// own /tokenize code), for a fleet of simulated replicas (warmpath
	// serve's embedded fleet and warmpath overhead turn it on). A
	// replica's /tokenize checks the local ids (see TokenizerVerifyEvery)
	// and stays the fallback. "hf" tokenizes in process each model of
	// TokenizerDirs with its own Hugging Face tokenizer files (package
	// hftok: byte-level BPE, the Llama 3 / Qwen2 / GPT-2 families); other
	// models go to the replicas.
	Tokenizer string `yaml:"tokenizer"`
	// TokenizerDirs maps a served model name (the request's "model", as
	// vLLM's --served-model-name) to the directory holding that model's
	// tokenizer.json and tokenizer_config.json (and chat_template.jinja
	// when the model has one): the model's Hugging Face repository or
	// the directory vLLM loads it from. Read once at start, never
	// fetched; a file that is missing or uses a feature hftok does not
	// support fails the start. Required by tokenizer: hf, and only used
	// by it. WARMPATH_TOKENIZER_DIRS: model=dir,model=dir.
	TokenizerDirs map[string]string `yaml:"tokenizer_dirs"`
	// TokenizerVerifyEvery: the in-process tokenizer's ids for a model's
	// first prompt, and then for one prompt in this many, are compared
	// with a replica's /tokenize off the request path; a mismatch stops
	// the local tokenizer for that model (see localtok.go). Default 256;
	// negative checks only the first prompt.
	TokenizerVerifyEvery int `yaml:"tokenizer_verify_every"`
}

// DefaultSessionTTL is how long a session binding outlives its turn.
const DefaultSessionTTL = 30 * time.Minute

// WithDefaults returns c with its unset fields filled in.
func (c Config) WithDefaults() Config {
	if c.Policy == "" {
		c.Policy = scoring.PolicyWarmpath
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.SpeculativeTTL == 0 {
		c.SpeculativeTTL = 2 * time.Second
	}
	c.Saturation = c.Saturation.WithDefaults()
	if c.TokenizeCacheBytes == 0 {
		c.TokenizeCacheBytes = 256 << 20
	}
	if c.Tokenizer == "" {
		c.Tokenizer = TokenizerReplicas
	}
	if c.TokenizerVerifyEvery == 0 {
		c.TokenizerVerifyEvery = 256
	}
	if c.IndexMaxEntries == 0 {
		c.IndexMaxEntries = blockindex.DefaultMaxEntries
	}
	if c.ApproxChunkBytes == 0 {
		c.ApproxChunkBytes = 256
	}
	return c
}

// Validate checks c after WithDefaults; each error names its field by
// its yaml path (routing.policy).
func (c *Config) Validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if u, err := url.Parse(c.TokenizeURL); c.TokenizeURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		bad("routing.tokenize_url", "%q is not an http(s) base URL", c.TokenizeURL)
	}
	switch t := c.Tokenizer; {
	case t != TokenizerReplicas && t != TokenizerSimulator && t != TokenizerHF:
		bad("routing.tokenizer", "%q is not %q (the default), %q or %q", t, TokenizerReplicas, TokenizerSimulator, TokenizerHF)
	case t == TokenizerHF && len(c.TokenizerDirs) == 0:
		bad("routing.tokenizer_dirs", "is empty: tokenizer hf needs each model's tokenizer directory")
	case t != TokenizerHF && len(c.TokenizerDirs) > 0:
		bad("routing.tokenizer_dirs", "is set but routing.tokenizer is %q, not %q", t, TokenizerHF)
	}
	for model, dir := range c.TokenizerDirs {
		if model == "" || dir == "" {
			bad("routing.tokenizer_dirs", "model %q has directory %q: both must be set", model, dir)
		}
	}
	if !slices.Contains(scoring.Policies(), c.Policy) {
		bad("routing.policy", "%q is not one of %s", c.Policy, strings.Join(scoring.Policies(), ", "))
	} else if _, err := scoring.NewPolicy(c.Policy, c.Weights); err != nil {
		bad("routing.weights", "%v", err)
	}
	if c.TokenizeCacheBytes < 0 {
		bad("routing.tokenize_cache_bytes", "%d is negative", c.TokenizeCacheBytes)
	}
	if c.BlockSize < 1 || c.BlockSize > 4096 {
		bad("routing.block_size", "%d is not in [1, 4096]", c.BlockSize)
	}
	if c.MaxKVUsage <= 0 || c.MaxKVUsage > 1 {
		bad("routing.max_kv_usage", "%v is not in (0, 1]", c.MaxKVUsage)
	}
	if c.MaxWaiting < 0 {
		bad("routing.max_waiting", "%d is negative", c.MaxWaiting)
	}
	return errs
}
