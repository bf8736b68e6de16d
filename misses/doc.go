// Package misses explains prefix-cache misses: where a turn's prompt
// stopped extending its session's previous one (the break locator), what
// each tenant's breaks have in common (hints), and why each uncached
// prompt token was uncached (the cause split). It is pure computation
// over values the gateway already has per request; it owns no goroutines,
// reads no clock and keeps no prompt text (only [Diff.Excerpt], when
// asked for, holds some).
//
// # Break locator
//
// [NewPrompt] (or [ParseChat]) renders a chat request canonically and
// cuts the rendering into parts: the leading system and developer
// messages ([PartSystem]), the tool definitions ([PartTools]) and the
// other messages ([PartMessage]), in that order. The session keeps the
// previous turn's [Fingerprint]: per part its kind, role, length and
// hash, each tool's hash, the chained hash of every granule of the
// rendering (16 bytes by default), and optionally the token block
// hashes of the prefix index ([Previous] keeps them in process memory
// within a byte budget; [Fingerprint.MarshalBinary] encodes one for a
// shared store and [Fingerprint.UnmarshalBinary] checks what it reads
// back; [Recent] finds a turn's previous turn by content when its session
// key changed with the break, as a key hashing the opening does). [Locate] compares a turn with it and
// returns a [Diff]: [KindExtends] when the turn starts with the whole
// previous prompt (no break; the new content is the tail),
// [KindPrefix] for a retry or a shorter prompt, and [KindBreak] with
// the part, the message index and role, the byte offset inside the
// part, the token and block offsets, how the part changed ([Change]:
// edited, tools reordered, an earlier message rewritten, a part inserted
// or removed) and short hashes of both sides. When both turns carry token
// block hashes and the body extends the previous one but the blocks part
// before the previous prompt's end, the break is the chat template's
// ([ChangeTemplate]: it renders an earlier turn differently). Text around the break
// ([Diff.Excerpt]) is returned only with [Options.Excerpts].
//
// Byte offsets are exact to a granule (the first differing granule's
// start, never after the true offset). Token offsets are exact to a
// block when both turns carry token block hashes ([Prompt.SetBlocks]),
// otherwise estimated at [Options.BytesPerToken].
//
// # Hints
//
// [Hints] keeps, per tenant, the last N compared turns (a ring) and
// groups their breaks by part, change and offset bucket into plain
// language ([Hint]): "the system prompt differs at token 37 on 96 % of
// turns: a timestamp or id early in the prompt?". Memory is bounded by
// [HintsConfig]; tenants never see each other's examples. A Hints is
// safe for concurrent use.
//
// # Cause split
//
// [Split] divides one request's uncached prompt tokens, prompt − cached,
// among [Causes]. It looks at each uncached token position t, from
// cached (C) up to prompt (P), and gives it the first cause whose rule
// holds:
//
//  1. t < Predicted, the tokens the index predicted cached on the chosen
//     replica: cold_replica if the replica joined or restarted after the
//     session's last turn (Fresh), else stale_index.
//  2. t < BestOther, the tokens cached on the best other replica:
//     routed_away.
//  3. t < Matched, the leading tokens still equal to the session's
//     previous prompt, which no replica was known to hold: cold_replica
//     if Fresh or the session's replica was lost (RouteLost);
//     routed_away if the session was moved off its replica
//     (RouteAway: load, a reserve, a rescoring); else evicted.
//  4. t < Previous, the previous prompt's length: client_prefix_break
//     (the previous turn covered these positions, but the client
//     changed what stands there).
//  5. Otherwise new.
//
// With [Turn.BlockTokens] set, Previous and Matched are first rounded
// down to whole blocks: an engine caches whole blocks only, so a partial
// block's tokens count as new, or as client_prefix_break when the break
// falls inside the block.
//
// Every input is clamped to [0, P] (C too; a negative P counts as 0), so
// the causes are non-negative and sum exactly to P − C for every input.
package misses
