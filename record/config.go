package record

import (
	"fmt"
	"log/slog"
)

// Defaults of Config.
const (
	DefaultMaxFileBytes = 64 << 20
	DefaultKeep         = 8
	DefaultQueue        = 4096
)

// Config configures a Recorder; its yaml fields are the record: block of
// the gateway's configuration file. The gateway records routed requests
// for offline replay (warmpath analyze): one JSON line per answered
// request with its time, keyed hashes of its tenant and session, its
// prompt's block keys at routing.block_size, its prompt, output and cached
// tokens and the replica that answered; never any text. A turn routed
// without tokenizing gets its block keys from the in-process tokenizer
// (routing.tokenizer), or has none without one. Off unless Dir is set.
// Tenant and session ids are hashed with HMAC-SHA-256 under
// auth.salt_secret when one is configured (the gateway sets Key).
//
// Dir is required by New; every other field has a default (WithDefaults).
type Config struct {
	// Dir is the folder the files are written to (Run creates it if
	// missing); empty turns recording off.
	Dir string `yaml:"dir"`
	// MaxFileBytes caps a file's size: a line that would pass it starts a
	// new file (a single longer line gets a file of its own); default 64
	// MiB.
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// Keep is how many files are kept, the current one included; older
	// ones are deleted. Default 8.
	Keep int `yaml:"keep"`
	// Queue is how many entries may wait for the writer; more are
	// dropped. Default DefaultQueue.
	Queue int `yaml:"-"`
	// Key keys the hashes of tenant and session ids (HMAC-SHA-256), so
	// that nobody without it can tell which tenant a line belongs to;
	// with no key they are plain SHA-256 hashes, which a guessed name
	// can be checked against.
	Key []byte `yaml:"-"`
	// Log receives write errors; nil discards them.
	Log *slog.Logger `yaml:"-"`
}

// WithDefaults returns c with every zero size and count at its default
// (New also takes a negative one for its default; Validate refuses it).
func (c Config) WithDefaults() Config {
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = DefaultMaxFileBytes
	}
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	return c
}

// Validate checks a configuration that turns recording on (Dir set; the
// rest is not read otherwise); its errors name the field by its yaml path
// (record.keep, …).
func (c Config) Validate() []error {
	if c.Dir == "" {
		return nil
	}
	var errs []error
	if c.MaxFileBytes < 0 {
		errs = append(errs, fmt.Errorf("config: record.max_file_bytes: %d is negative", c.MaxFileBytes))
	}
	if c.Keep < 0 {
		errs = append(errs, fmt.Errorf("config: record.keep: %d is negative", c.Keep))
	}
	return errs
}
