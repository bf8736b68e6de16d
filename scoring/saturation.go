package scoring

// Saturation defaults. A busy vLLM keeps its KV cache nearly full of
// running sequences and a short queue, so lower thresholds trip on every
// replica during a burst (bench, shared-prefix, tuned on seeds 2 and 3: p99
// TTFT 35–41 s at 8 waiting and 0.95 KV use, about 1 s at these).
const (
	DefaultMaxWaiting = 32
	DefaultMaxKVUsage = 1.0 // a completely full cache
	// DefaultMaxInflightPrefillTokens is about 17 s of prefill at 15,000
	// tokens/s.
	DefaultMaxInflightPrefillTokens = 262144
)

// Saturation reasons returned by [Saturation.Judge].
const (
	SaturatedWaiting  = "waiting"  // engine queue at or above MaxWaiting
	SaturatedKV       = "kv"       // KV usage at or above MaxKVUsage
	SaturatedInflight = "inflight" // in-flight prefill tokens at or above MaxInflightPrefillTokens
)

// Saturation holds the thresholds at or above which a replica counts as
// saturated (Endpoint.Saturated): a sticky policy without estimates then
// moves its sessions (see [Policy.Decide]); the estimated warmpath policy
// reads load instead. The gateway judges its replicas with it (and reports
// it), and the offline analyzer its simulated ones.
type Saturation struct {
	// MaxWaiting is the engine queue length at or above which a replica
	// is saturated. Default DefaultMaxWaiting (32); negative disables.
	MaxWaiting int `yaml:"max_waiting"`
	// MaxKVUsage is the KV-cache usage fraction at or above which a
	// replica is saturated. Default DefaultMaxKVUsage (1.0); negative
	// disables.
	MaxKVUsage float64 `yaml:"max_kv_usage"`
	// MaxInflightPrefillTokens is the number of uncached prompt tokens in
	// flight from this gateway at or above which a replica is saturated.
	// Default DefaultMaxInflightPrefillTokens (262,144); negative disables.
	MaxInflightPrefillTokens int64 `yaml:"max_inflight_prefill_tokens"`
}

// WithDefaults returns s with zero fields at their defaults.
func (s Saturation) WithDefaults() Saturation {
	if s.MaxWaiting == 0 {
		s.MaxWaiting = DefaultMaxWaiting
	}
	if s.MaxKVUsage == 0 {
		s.MaxKVUsage = DefaultMaxKVUsage
	}
	if s.MaxInflightPrefillTokens == 0 {
		s.MaxInflightPrefillTokens = DefaultMaxInflightPrefillTokens
	}
	return s
}

// Judge reports whether a replica with this load is saturated, and why,
// checking the queue, then KV use, then in-flight prefill. Thresholds are
// used as given (call WithDefaults first); negative ones are off.
func (s Saturation) Judge(waiting int, kvUsage float64, inflightPrefillTokens int64) (bool, string) {
	switch {
	case s.MaxWaiting >= 0 && waiting >= s.MaxWaiting:
		return true, SaturatedWaiting
	case s.MaxKVUsage >= 0 && kvUsage >= s.MaxKVUsage:
		return true, SaturatedKV
	case s.MaxInflightPrefillTokens >= 0 && inflightPrefillTokens >= s.MaxInflightPrefillTokens:
		return true, SaturatedInflight
	}
	return false, ""
}
