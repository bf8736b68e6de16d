package proxy

import (
	"github.com/warmpath/warmpath/internal/confcheck"
	"time"
)

// Config is the upstream: block of the gateway's configuration: it bounds
// every call the gateway makes to a replica. A call that fails before the
// first byte reaches the client (refused, timed out, or left hanging on a
// replica the health checks mark down) is reported to the replica's
// health and retried once on the next-best replica; a stream that stalls
// after it started is ended with an error event. The zero value is valid
// after WithDefaults.
type Config struct {
	// ConnectTimeout bounds dialing a replica; default 2s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// HeaderTimeout bounds the wait for response headers; default 10m.
	// A non-streaming answer's headers come with the whole answer, so it
	// bounds the generation too. A request waiting on a replica that the
	// health checks mark down is released at once, whatever this says.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// FirstByteTimeout bounds a stream's wait from its headers to its
	// first event (vLLM sends headers at once, then queues and
	// prefills); default 10m.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// IdleTimeout bounds the silence between a stream's events once it
	// has started; default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// TokenizeTimeout bounds one /tokenize call; default 2s. A replica
	// that times out is reported to health and the next one is asked
	// (calls that time out together count as one failure).
	TokenizeTimeout time.Duration `yaml:"tokenize_timeout"`
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	def(&c.ConnectTimeout, 2*time.Second)
	def(&c.HeaderTimeout, 10*time.Minute)
	def(&c.FirstByteTimeout, 10*time.Minute)
	def(&c.IdleTimeout, 2*time.Minute)
	def(&c.TokenizeTimeout, 2*time.Second)
	return c
}

// Validate checks c; each error names its field under upstream.
func (c Config) Validate() []error {
	return confcheck.NonNegative("upstream",
		confcheck.Field("connect_timeout", c.ConnectTimeout), confcheck.Field("header_timeout", c.HeaderTimeout),
		confcheck.Field("first_byte_timeout", c.FirstByteTimeout), confcheck.Field("idle_timeout", c.IdleTimeout),
		confcheck.Field("tokenize_timeout", c.TokenizeTimeout))
}
