package misses

import "github.com/cespare/xxhash/v2"

// Defaults of Options.
const (
	// DefaultGranuleBytes is the default rendering granule: a break is
	// placed to within 16 bytes, about 4 tokens.
	DefaultGranuleBytes = 16
	// DefaultBytesPerToken is the default bytes of rendering per token.
	DefaultBytesPerToken = 4.0
	// DefaultBlockTokens is the default KV block size in tokens.
	DefaultBlockTokens = 16
	// DefaultExcerptBytes is the default size of an excerpt.
	DefaultExcerptBytes = 96
)

// Options configures Fingerprint and Locate. The zero value is valid:
// every field has a default.
type Options struct {
	// GranuleBytes is the size of the rendering's granules, the precision
	// to which a break is placed from text; a fingerprint keeps 4 bytes a
	// granule. Default DefaultGranuleBytes. Locate uses the previous
	// fingerprint's own granule size.
	GranuleBytes int
	// BytesPerToken converts byte offsets of the rendering to tokens when
	// no token block hashes are given (the model's learned ratio, if
	// known); default DefaultBytesPerToken.
	BytesPerToken float64
	// BlockTokens is the KV block size in tokens, to turn token offsets
	// into block offsets when no block hashes are given; default
	// DefaultBlockTokens.
	BlockTokens int
	// Excerpts makes Locate return the current prompt's text around the
	// break (Diff.Excerpt). Off by default: only for tenants that opt in.
	Excerpts bool
	// ExcerptBytes is the excerpt's size; default DefaultExcerptBytes.
	ExcerptBytes int
}

func (o Options) withDefaults() Options {
	if o.GranuleBytes <= 0 {
		o.GranuleBytes = DefaultGranuleBytes
	}
	if o.BytesPerToken <= 0 {
		o.BytesPerToken = DefaultBytesPerToken
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = DefaultBlockTokens
	}
	if o.ExcerptBytes <= 0 {
		o.ExcerptBytes = DefaultExcerptBytes
	}
	return o
}

// PartPrint is one part of a fingerprint: what the part is, the length of
// its body in bytes and a hash of its header and body.
type PartPrint struct {
	Part  Part
	Index int32 // the message index; -1 for tools
	Role  string
	Len   int32
	Hash  uint64
}

// Fingerprint is what a session keeps of its previous turn's prompt to
// locate the next turn's break: no text, only hashes and lengths. Its
// size is about 4 bytes per GranuleBytes of rendering plus 8 bytes per
// part, tool and token block (Size). Fields are exported so a store can
// serialize it; a Fingerprint is not modified by Locate.
type Fingerprint struct {
	Parts []PartPrint
	// Tools holds each tool definition's hash, in order.
	Tools []uint64
	// Granules holds the chained hash of each full granule of the
	// rendering: Granules[i] covers bytes [0, (i+1)*GranuleBytes).
	Granules     []uint32
	GranuleBytes int
	// Bytes is the rendering's length.
	Bytes int
	// Blocks and BlockTokens are the prompt's token block hashes, when
	// known (Prompt.SetBlocks).
	Blocks      []uint64
	BlockTokens int
	// Tokens is the prompt's length in tokens when known (the usage the
	// replica reported); 0 when unknown. The caller sets it.
	Tokens int
}

// Fingerprint returns the prompt's fingerprint.
func (p *Prompt) Fingerprint(opt Options) *Fingerprint {
	opt = opt.withDefaults()
	f := &Fingerprint{GranuleBytes: opt.GranuleBytes, Bytes: len(p.text), Blocks: p.blocks, BlockTokens: p.blockTokens}
	f.Parts = make([]PartPrint, len(p.parts))
	for i, s := range p.parts {
		f.Parts[i] = PartPrint{Part: s.part, Index: int32(s.index), Role: s.role, Len: int32(s.end - s.start), Hash: s.hash}
	}
	for _, t := range p.tools {
		f.Tools = append(f.Tools, t.hash)
	}
	f.Granules = granules(p.text, opt.GranuleBytes, -1)
	return f
}

// Size returns the fingerprint's approximate memory in bytes.
func (f *Fingerprint) Size() int {
	return 80 + len(f.Parts)*40 + 8*len(f.Tools) + 4*len(f.Granules) + 8*len(f.Blocks)
}

// granules returns the chained hashes of text's full granules of g bytes,
// at most limit of them (no limit when limit < 0): granule i's is the low
// 32 bits of the hash of text[:(i+1)*g], taken from one running digest.
func granules(text []byte, g, limit int) []uint32 {
	n := len(text) / g
	if limit >= 0 {
		n = min(n, limit)
	}
	out := make([]uint32, n)
	d := xxhash.New()
	for i := range n {
		_, _ = d.Write(text[i*g : (i+1)*g])
		out[i] = uint32(d.Sum64())
	}
	return out
}
