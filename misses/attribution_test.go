package misses

import (
	"fmt"
	"testing"
)

// TestClientMissesAttributed replays the four clients of
// TestClientsDiagnosed against a replica that keeps every block
// (nothing is evicted, nothing routed away): the misses of the three
// clients that break their prefix go to client_prefix_break, the
// appender's are all new, and every split sums to prompt − cached.
func TestClientMissesAttributed(t *testing.T) {
	const block = 16
	clients := map[string]func(n int) []byte{
		"timestamp": func(n int) []byte {
			return chatBody(t, weatherTools, conversation(n, fmt.Sprintf("Current date and time: 2026-12-06 21:%02d:%02d. %s", n, 7*n%60, sysPrompt), false)...)
		},
		"shuffler": func(n int) []byte {
			tools := append([]string(nil), weatherTools[n%2:]...)
			return chatBody(t, append(tools, weatherTools[:n%2]...), conversation(n, sysPrompt, false)...)
		},
		"rewriter": func(n int) []byte { return chatBody(t, weatherTools, conversation(n, sysPrompt, true)...) },
		"appender": func(n int) []byte { return chatBody(t, weatherTools, conversation(n, sysPrompt, false)...) },
	}
	for name, turn := range clients {
		var prev *Fingerprint
		var total Causes
		for n := 1; n <= 6; n++ {
			p := mustPrompt(t, turn(n))
			d := Locate(prev, p, Options{})
			prompt := curTokens(p, Options{}.withDefaults())
			// The replica held the whole previous prompt: it serves the
			// matched prefix, in whole blocks.
			cached := min(d.Matched, prompt) / block * block
			tu := Turn{Prompt: prompt, Cached: cached, Previous: d.Previous, Matched: d.Matched,
				Predicted: cached, BlockTokens: block}
			c := Split(tu)
			if c.Total() != prompt-cached {
				t.Fatalf("%s turn %d: causes %v sum to %d; want %d", name, n, c, c.Total(), prompt-cached)
			}
			for i, v := range c {
				total[i] += v
			}
			fp := p.Fingerprint(Options{})
			fp.Tokens = prompt
			prev = fp
		}
		breaks := total[CauseClientBreak]
		if others := total.Total() - breaks - total[CauseNew]; others != 0 {
			t.Errorf("%s: got causes %v; want only new and client_prefix_break", name, total)
		}
		if (name == "appender") != (breaks == 0) {
			t.Errorf("%s: got %d client_prefix_break tokens (causes %v)", name, breaks, total)
		}
		t.Logf("%s: %v", name, total)
	}
}
