package misses

import (
	"fmt"
	"strings"
	"testing"
)

// longConversation is an agent's turn n: a 4 KB system prompt, four
// tools, and n exchanges of about 1.5 KB each.
func longConversation(tb testing.TB, n int) []byte {
	sys := strings.Repeat("Follow the repository's conventions; keep diffs small. ", 75)
	ms := []msg{{"system", sys}, {"user", "Refactor the billing module."}}
	for i := range n {
		ms = append(ms, msg{"assistant", fmt.Sprintf("Step %d. %s", i, strings.Repeat("I read the file and changed the handler. ", 20))},
			msg{"user", fmt.Sprintf("Tool output %d: %s", i, strings.Repeat("ok line of output\n", 40))})
	}
	return chatBody(tb, weatherTools, ms...)
}

// BenchmarkTurn measures what the gateway would do per turn of a
// 100 KB conversation: render the prompt, locate it against the previous
// turn's fingerprint, and fingerprint it for the next.
func BenchmarkTurn(b *testing.B) {
	prevBody, body := longConversation(b, 59), longConversation(b, 60)
	prev := mustPrompt(b, prevBody).Fingerprint(Options{})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := ParseChat(body)
		if err != nil {
			b.Fatal(err)
		}
		if d := Locate(prev, p, Options{}); d.Kind != KindExtends {
			b.Fatalf("got %v", d.Kind)
		}
		_ = p.Fingerprint(Options{})
	}
	b.ReportMetric(float64(prev.Size()), "fingerprint-B")
}

// BenchmarkLocateBreak measures locating a break at the start of a
// 100 KB prompt (the whole rendering is hashed again).
func BenchmarkLocateBreak(b *testing.B) {
	prev := mustPrompt(b, longConversation(b, 60)).Fingerprint(Options{})
	body := strings.Replace(string(longConversation(b, 60)), "Follow", "Obey", 1)
	p := mustPrompt(b, []byte(body))
	b.ReportAllocs()
	for b.Loop() {
		if d := Locate(prev, p, Options{}); d.Kind != KindBreak {
			b.Fatalf("got %v", d.Kind)
		}
	}
}
