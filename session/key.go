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
// precedence: vLLM's and Dynamo's X-Session-ID, then the agent harnesses'
// (Claude Code, Codex, OpenCode).
var Headers = []string{"X-Session-ID", "X-Claude-Code-Session-Id", "Session_id", "Session-Id", "X-Session-Affinity"}

// Sub-agent headers: Claude Code sends its session id with every request of
// a run, and names the sub-agent (and the sub-agent that spawned it, when
// there is one) on each of that sub-agent's requests.
const (
	AgentHeader       = "X-Claude-Code-Agent-Id"
	ParentAgentHeader = "X-Claude-Code-Parent-Agent-Id"
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
	// Value is the key, prefixed by its kind so different sources never
	// collide; "" when the request carries nothing to key on.
	Value string
	// Source is one of the Source constants.
	Source string
	// Parent is the key of the conversation this one was spawned from: a
	// sub-agent's parent agent, or the run's main conversation; "" for a
	// conversation of its own.
	Parent string
}

// Identify derives the session key of a request. scope (a tenant, a model)
// is folded into every key so the same identifier in two scopes names two
// sessions.
func Identify(scope string, h http.Header, b Body) Key {
	for _, name := range Headers {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return headerKey(scope, v, h)
		}
	}
	switch {
	case b.SessionID != "":
		return Key{Value: mk(scope, "s", b.SessionID), Source: SourceSessionID}
	case b.PromptCacheKey != "":
		return Key{Value: mk(scope, "p", b.PromptCacheKey), Source: SourcePromptCacheKey}
	case b.User != "":
		return Key{Value: mk(scope, "u", b.User), Source: SourceUser}
	case b.SafetyIdentifier != "":
		return Key{Value: mk(scope, "u", b.SafetyIdentifier), Source: SourceUser}
	case len(b.Opening) > 0:
		var sum [8]byte
		d := xxhash.New()
		d.WriteString(scope)
		d.Write([]byte{0})
		d.Write(b.Opening)
		return Key{Value: "o:" + hex.EncodeToString(d.Sum(sum[:0])), Source: SourceOpening}
	}
	return Key{Source: SourceNone}
}

// headerKey is the key of a session named by a header. A sub-agent's
// requests carry the run's session id too, but the sub-agent is a
// conversation of its own (its own system prompt and history, so its own
// prefix): it gets its own key, under the run's, with its parent's key as
// Parent, so that neither rebinds the other.
func headerKey(scope, session string, h http.Header) Key {
	agent := strings.TrimSpace(h.Get(AgentHeader))
	if agent == "" {
		return Key{Value: mk(scope, "h", session), Source: SourceHeader}
	}
	k := Key{Value: mk(scope, "h", session+"/agent/"+agent), Source: SourceHeader, Parent: mk(scope, "h", session)}
	if parent := strings.TrimSpace(h.Get(ParentAgentHeader)); parent != "" && parent != agent {
		k.Parent = mk(scope, "h", session+"/agent/"+parent)
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
