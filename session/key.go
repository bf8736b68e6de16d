package session

import (
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Sources of a session key, in order of precedence.
const (
	SourceHeader         = "header"
	SourceSessionID      = "session_id"
	SourcePromptCacheKey = "prompt_cache_key"
	SourceUser           = "user"
	SourceOpening        = "opening"
	SourceNone           = "none"
	SourceChain          = "chain" // a Responses chain root or conversation, see Chain
)

// Headers are the request headers that name a session, in order of
// precedence: vLLM's and Dynamo's X-Session-ID, Dynamo's
// X-Dynamo-Session-ID, then the agent harnesses' (Claude Code, Codex,
// OpenCode).
var Headers = []string{"X-Session-ID", "X-Dynamo-Session-ID", "X-Claude-Code-Session-Id", "Session_id", "Session-Id", "X-Session-Affinity"}

// Sub-agent headers: Claude Code sends its session id with every request of
// a run, and names the sub-agent (and the sub-agent that spawned it, when
// there is one) on each of that sub-agent's requests. ParentSessionHeader
// is Dynamo's name for a parent session.
const (
	AgentHeader         = "X-Claude-Code-Agent-Id"
	ParentAgentHeader   = "X-Claude-Code-Parent-Agent-Id"
	ParentSessionHeader = "X-Dynamo-Parent-Session-ID"
)

// maxKeyLen bounds client-supplied identifiers; longer ones are hashed.
const maxKeyLen = 128

// Body holds what a request body says about its session.
type Body struct {
	// SessionID is vLLM's session_id body field.
	SessionID string
	// PromptCacheKey is OpenAI's prompt_cache_key.
	PromptCacheKey string
	// User is the deprecated user field; SafetyIdentifier its successor.
	User, SafetyIdentifier string
	// Opening is a canonical rendering of the conversation's opening
	// (system/developer messages, tools, first user message); nil when the
	// body has none.
	Opening []byte
}

// Key is a request's session key and where it came from.
type Key struct {
	// Value is the key of the request's conversation, prefixed by its kind
	// so different sources never collide; "" when the request carries
	// nothing to key on. It is never coarser than the conversation: a
	// client-named session (a header, session_id, prompt_cache_key, user)
	// is split by the conversation's opening, so a harness's side requests
	// (OpenCode's title generation, with another system prompt and no
	// tools) and sub-agents (the parent's harness, their own brief) get
	// bindings of their own under one session id.
	Value string
	// Source is one of the Source constants.
	Source string
	// Family is the client-named session (or sub-agent) the conversation
	// belongs to, "" when the client names none: its conversations publish
	// their replica under it, for relatives to find.
	Family string
	// Parent is the family of the conversation's parent (a sub-agent's
	// parent session or agent), "" when none is named.
	Parent string
}

// Relatives returns the family key whose replica the conversation's
// first turn should prefer: its parent's, else its own family's (another
// conversation under the same session id); "" when it has neither.
func (k Key) Relatives() string {
	if k.Parent != "" {
		return k.Parent
	}
	return k.Family
}

// Identify derives the session key of a request. scope (a tenant, a model)
// is folded into every key so the same identifier in two scopes names two
// sessions.
func Identify(scope string, h http.Header, b Body) Key {
	k := named(scope, h, b)
	if k.Source == SourceNone && len(b.Opening) > 0 {
		return Key{Value: "o:" + openingHash(scope, b.Opening), Source: SourceOpening}
	}
	k.Value = k.Family
	if len(b.Opening) > 0 {
		k.Value += "/" + openingHash(scope, b.Opening)
	}
	return k
}

// named returns the session the client names, with Family set and Value
// not yet split by the opening.
func named(scope string, h http.Header, b Body) Key {
	for _, name := range Headers {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return headerKey(scope, v, h)
		}
	}
	switch {
	case b.SessionID != "":
		return Key{Family: mk(scope, "s", b.SessionID), Source: SourceSessionID}
	case b.PromptCacheKey != "":
		return Key{Family: mk(scope, "p", b.PromptCacheKey), Source: SourcePromptCacheKey}
	case b.User != "":
		return Key{Family: mk(scope, "u", b.User), Source: SourceUser}
	case b.SafetyIdentifier != "":
		return Key{Family: mk(scope, "u", b.SafetyIdentifier), Source: SourceUser}
	}
	return Key{Source: SourceNone}
}

// openingHash is the hex xxhash of scope and an opening.
func openingHash(scope string, opening []byte) string {
	var sum [8]byte
	d := xxhash.New()
	d.WriteString(scope)
	d.Write([]byte{0})
	d.Write(opening)
	return hex.EncodeToString(d.Sum(sum[:0]))
}

// headerKey is the family of a session named by a header. A sub-agent's
// requests carry the run's session id too, but the sub-agent is a
// conversation of its own (its own system prompt and history, so its own
// prefix): it is a family of its own, under the run's, whose Parent is the
// run's family, the sub-agent that spawned it, or the parent session
// Dynamo's header names, so that neither rebinds the other.
func headerKey(scope, session string, h http.Header) Key {
	k := Key{Family: mk(scope, "h", session), Source: SourceHeader}
	if agent := strings.TrimSpace(h.Get(AgentHeader)); agent != "" {
		k.Family, k.Parent = mk(scope, "h", session+"/agent/"+agent), k.Family
		if parent := strings.TrimSpace(h.Get(ParentAgentHeader)); parent != "" && parent != agent {
			k.Parent = mk(scope, "h", session+"/agent/"+parent)
		}
	}
	if parent := strings.TrimSpace(h.Get(ParentSessionHeader)); parent != "" {
		k.Parent = mk(scope, "h", parent)
	}
	return k
}

// Chain is the session key of a Responses API chain: every turn chained to
// the response id root (or appended to the conversation id root) shares
// it, so the whole run is routed to the replica holding its prefix. scope
// is the tenant.
func Chain(scope, root string) Key {
	return Key{Value: mk(scope, "r", root), Source: SourceChain}
}

// mk builds a key from a client identifier; long or unprintable
// identifiers are hashed so keys stay short and safe as Redis keys.
func mk(scope, kind, v string) string {
	if len(v) > maxKeyLen || strings.ContainsFunc(v, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		var sum [8]byte
		d := xxhash.New()
		d.WriteString(v)
		v = "#" + hex.EncodeToString(d.Sum(sum[:0]))
	}
	if scope == "" {
		return kind + ":" + v
	}
	return kind + ":" + scope + ":" + v
}
