package misses_test

import (
	"fmt"
	"time"

	"github.com/warmpath/warmpath/misses"
)

func ExampleLocate() {
	turn1 := `{"model":"m","messages":[
		{"role":"system","content":"Now: 2026-12-06T21:00:00Z. You are a helpful assistant."},
		{"role":"user","content":"Hello"}]}`
	turn2 := `{"model":"m","messages":[
		{"role":"system","content":"Now: 2026-12-06T21:00:42Z. You are a helpful assistant."},
		{"role":"user","content":"Hello"},
		{"role":"assistant","content":"Hi! How can I help?"},
		{"role":"user","content":"Tell me a joke."}]}`
	p1, _ := misses.ParseChat([]byte(turn1))
	prev := p1.Fingerprint(misses.Options{}) // kept with the session, instead of the text
	p2, _ := misses.ParseChat([]byte(turn2))
	d := misses.Locate(prev, p2, misses.Options{Excerpts: true})
	fmt.Println(d.Kind, d.Part, d.Change, "message", d.Index, "offset", d.Offset, "token", d.Token)
	fmt.Printf("%q\n", d.Excerpt)
	// Output:
	// break system edited message 0 offset 17 token 8
	// "Now: 2026-12-06T21:00:42Z. You are a helpful assistant."
}

func ExampleSplit() {
	// The client broke its prefix at token 37 of a 1,000-token previous
	// prompt; the replica served the first two 16-token blocks.
	c := misses.Split(misses.Turn{Prompt: 1200, Cached: 32, Previous: 1000, Matched: 37, Predicted: 32, BlockTokens: 16})
	for cause, n := range c {
		if n > 0 {
			fmt.Println(misses.Cause(cause), n)
		}
	}
	fmt.Println("total", c.Total())
	// Output:
	// new 208
	// client_prefix_break 960
	// total 1168
}

func ExampleHints() {
	h := misses.NewHints(misses.HintsConfig{})
	at := time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)
	for range 24 {
		h.Observe("acme", at, misses.Diff{Kind: misses.KindBreak, Part: misses.PartSystem, Change: misses.ChangeEdited, Token: 37})
	}
	h.Observe("acme", at, misses.Diff{Kind: misses.KindExtends, Part: misses.PartTail})
	for _, hint := range h.Hints("acme") {
		fmt.Println(hint.Text)
	}
	// Output:
	// the system prompt differs at token 37 on 96 % of turns: a timestamp or id early in the prompt?
}
