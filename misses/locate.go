package misses

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Kind says how a turn's prompt relates to its session's previous one.
type Kind uint8

// The kinds of Diff.
const (
	KindFirst   Kind = iota // no previous turn to compare with
	KindExtends             // the prompt starts with the whole previous prompt: no break
	KindPrefix              // the prompt is the previous one or a prefix of it (a retry, a regeneration): no break
	KindBreak               // the prompt differs from the previous one before the latter's end
)

var kindNames = [...]string{"first", "extends", "prefix", "break"}

// String returns the kind's name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Change says what a break did to its part.
type Change uint8

// The changes of a break.
const (
	ChangeNone           Change = iota // no break
	ChangeEdited                       // a system message or the tool definitions differ
	ChangeToolsReordered               // the same tool definitions in another order
	ChangeRewritten                    // an earlier message's content or role differs
	ChangeInserted                     // a part stands where the previous prompt had a later kind of part (a system message or tools added, say)
	ChangeRemoved                      // a part of the previous prompt is gone (a system message or the tools dropped)
	ChangeTemplate                     // the body extends the previous one, but its tokens do not: the chat template renders an earlier part differently
)

var changeNames = [...]string{"none", "edited", "tools_reordered", "rewritten", "inserted", "removed", "template"}

// String returns the change's name.
func (c Change) String() string {
	if int(c) < len(changeNames) {
		return changeNames[c]
	}
	return "unknown"
}

// Diff is where a turn's prompt first differs from its session's previous
// turn's. Offsets in bytes are lower bounds, exact to the previous
// fingerprint's granule; token offsets are exact to a block when both
// sides have token block hashes (Exact), else estimated from bytes.
type Diff struct {
	Kind   Kind
	Change Change
	// Part is the part that differs: for a break, the part where it
	// falls; PartTail when the prompt extends the previous one.
	Part Part
	// Index is the message index (in the body's messages array) of a
	// system or message part, the index of the first differing tool for
	// PartTools, and -1 otherwise.
	Index int
	Role  string
	// Offset is the break's byte offset inside the part's body (its
	// content, after the role).
	Offset int
	// Byte is the break's offset in the canonical rendering.
	Byte int
	// Token and Block are the break's offsets in tokens and KV blocks;
	// for KindExtends, the previous prompt's end.
	Token, Block int
	// Exact reports that Token and Block come from token counts or token
	// block hashes (exact to a block), not from the rendering's bytes.
	Exact bool
	// Matched is how many leading tokens of this prompt equal the
	// previous prompt's: all of the previous prompt unless it broke.
	Matched int
	// Previous is the previous prompt's length in tokens (0 for
	// KindFirst).
	Previous int
	// PrevHash and CurHash are short hashes (8 hex digits) of the
	// differing part on each side; "" for a side that lacks it.
	PrevHash, CurHash string
	// Excerpt is the current prompt's text around the break, set only
	// with Options.Excerpts.
	Excerpt string
}

// Broke reports whether the turn broke its session's prefix.
func (d Diff) Broke() bool { return d.Kind == KindBreak }

// Locate finds where cur first differs from prev, the fingerprint of its
// session's previous turn (nil when there is none: KindFirst).
func Locate(prev *Fingerprint, cur *Prompt, opt Options) Diff {
	opt = opt.withDefaults()
	if prev == nil {
		return Diff{Kind: KindFirst, Index: -1}
	}
	i := 0
	for i < len(prev.Parts) && i < len(cur.parts) && samePart(prev.Parts[i], cur.parts[i]) {
		i++
	}
	prevTok := prevTokens(prev, opt)
	switch {
	case i == len(prev.Parts) && i < len(cur.parts):
		if k, ok := blockBreak(prev, cur); ok && k < len(prev.Blocks) {
			return templateBreak(prev, cur, k, prevTok, opt)
		}
		s := cur.parts[i]
		d := Diff{Kind: KindExtends, Part: PartTail, Index: s.index, Role: s.role, Byte: s.head,
			Token: prevTok, Matched: prevTok, Previous: prevTok}
		d.Block = prevTok / blockTokens(prev, opt)
		d.Exact = prevTok > 0 && (prev.Tokens > 0 || len(prev.Blocks) > 0 && prev.BlockTokens > 0)
		return d
	case i == len(cur.parts):
		n := min(prevTok, curTokens(cur, opt))
		return Diff{Kind: KindPrefix, Index: -1, Byte: len(cur.text), Token: n, Block: n / blockTokens(prev, opt),
			Matched: n, Previous: prevTok}
	}
	d := breakAt(prev, cur, i, opt)
	d.Previous = prevTok
	placeTokens(&d, prev, cur, opt)
	if opt.Excerpts && d.Change != ChangeRemoved {
		d.Excerpt = excerpt(cur.text, cur.parts[i], d.Byte, opt.ExcerptBytes)
	}
	return d
}

func samePart(p PartPrint, s span) bool {
	return p.Part == s.part && p.Role == s.role && int(p.Len) == s.end-s.start && p.Hash == s.hash
}

// breakAt describes the break at part i, the first that differs.
func breakAt(prev *Fingerprint, cur *Prompt, i int, opt Options) Diff {
	pp, cs := prev.Parts[i], cur.parts[i]
	d := Diff{Kind: KindBreak, Part: cs.part, Index: cs.index, Role: cs.role, Byte: cs.head,
		PrevHash: short(pp.Hash), CurHash: short(cs.hash)}
	switch {
	case cs.part < pp.Part:
		d.Change, d.PrevHash = ChangeInserted, ""
		return d
	case cs.part > pp.Part:
		d.Change, d.Part, d.Index, d.Role, d.CurHash = ChangeRemoved, pp.Part, int(pp.Index), pp.Role, ""
		return d
	case cs.part == PartMessage:
		d.Change = ChangeRewritten
	default:
		d.Change = ChangeEdited
	}
	g := prev.GranuleBytes
	if g <= 0 {
		g = opt.GranuleBytes
	}
	d.Byte = max(cs.head, firstGranuleDiff(prev, cur, g)*g)
	if cs.part == PartTools {
		toolsBreak(&d, prev, cur)
	}
	d.Byte = min(d.Byte, cs.end)
	d.Offset = max(0, d.Byte-cs.start)
	return d
}

// toolsBreak places a break in the tool definitions at the first tool
// that differs, and tells a reordering (the same tools) from an edit.
func toolsBreak(d *Diff, prev *Fingerprint, cur *Prompt) {
	j := 0
	for j < len(prev.Tools) && j < len(cur.tools) && prev.Tools[j] == cur.tools[j].hash {
		j++
	}
	d.Index = j
	if j < len(cur.tools) {
		d.Byte = max(d.Byte, cur.tools[j].start)
	}
	a := slices.Clone(prev.Tools)
	b := make([]uint64, len(cur.tools))
	for k, t := range cur.tools {
		b[k] = t.hash
	}
	slices.Sort(a)
	slices.Sort(b)
	if slices.Equal(a, b) && j < len(cur.tools) {
		// The break is the tool out of place, not the bytes its
		// neighbour's name happens to share with it.
		d.Change = ChangeToolsReordered
		d.Byte = cur.tools[j].start
	}
}

// firstGranuleDiff returns the index of cur's first granule of g bytes
// whose chained hash differs from prev's (or the number both have).
func firstGranuleDiff(prev *Fingerprint, cur *Prompt, g int) int {
	mine := granules(cur.text, g, len(prev.Granules))
	k := 0
	for k < len(mine) && mine[k] == prev.Granules[k] {
		k++
	}
	return k
}

// placeTokens sets a break's token and block offsets and Matched: from
// the token block hashes when both sides have them at one block size,
// else from the byte offset.
func placeTokens(d *Diff, prev *Fingerprint, cur *Prompt, opt Options) {
	if k, ok := blockBreak(prev, cur); ok {
		d.Block, d.Token, d.Exact = k, k*cur.blockTokens, true
	} else {
		d.Token = int(float64(d.Byte) / opt.BytesPerToken)
		d.Block = d.Token / opt.BlockTokens
	}
	d.Matched = min(d.Token, d.Previous)
}

// blockBreak returns the index of the first token block that differs
// between prev and cur (or the number both have), if both have block
// hashes at one block size.
func blockBreak(prev *Fingerprint, cur *Prompt) (int, bool) {
	if len(prev.Blocks) == 0 || len(cur.blocks) == 0 || prev.BlockTokens != cur.blockTokens {
		return 0, false
	}
	k := 0
	for k < len(prev.Blocks) && k < len(cur.blocks) && prev.Blocks[k] == cur.blocks[k] {
		k++
	}
	return k, true
}

// templateBreak describes a turn whose body extends the previous one but
// whose token blocks part from it at block k: the template rendered an
// earlier part differently. The part is the one at the block's estimated
// byte offset.
func templateBreak(prev *Fingerprint, cur *Prompt, k, prevTok int, opt Options) Diff {
	tok := k * cur.blockTokens
	at := min(int(float64(tok)*opt.BytesPerToken), len(cur.text))
	i := 0
	for i+1 < len(cur.parts) && cur.parts[i+1].head <= at {
		i++
	}
	s := cur.parts[i]
	return Diff{Kind: KindBreak, Change: ChangeTemplate, Part: s.part, Index: s.index, Role: s.role,
		Byte: at, Offset: min(max(0, at-s.start), s.end-s.start), Token: tok, Block: k, Exact: true,
		Matched: min(tok, prevTok), Previous: prevTok}
}

func prevTokens(f *Fingerprint, opt Options) int {
	switch {
	case f.Tokens > 0:
		return f.Tokens
	case len(f.Blocks) > 0 && f.BlockTokens > 0:
		return len(f.Blocks) * f.BlockTokens
	}
	return int(float64(f.Bytes) / opt.BytesPerToken)
}

func curTokens(p *Prompt, opt Options) int {
	if len(p.blocks) > 0 {
		return len(p.blocks) * p.blockTokens
	}
	return int(float64(len(p.text)) / opt.BytesPerToken)
}

func blockTokens(f *Fingerprint, opt Options) int {
	if len(f.Blocks) > 0 && f.BlockTokens > 0 {
		return f.BlockTokens
	}
	return opt.BlockTokens
}

// short is a short hash for display: the top 32 bits in hex.
func short(h uint64) string { return fmt.Sprintf("%08x", uint32(h>>32)) }

// excerpt returns the text of part s around byte at, n bytes at most,
// cut at rune boundaries, with the rendering's NUL separators shown as
// " | ".
func excerpt(text []byte, s span, at, n int) string {
	lo := max(s.start, at-n/3)
	hi := min(s.end, lo+n)
	for lo < hi && !utf8.RuneStart(text[lo]) {
		lo++
	}
	for hi > lo && hi < len(text) && !utf8.RuneStart(text[hi]) {
		hi--
	}
	return strings.ReplaceAll(strings.ToValidUTF8(string(text[lo:hi]), "\uFFFD"), "\x00", " | ")
}
