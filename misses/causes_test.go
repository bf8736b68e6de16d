package misses

import (
	"testing"

	"github.com/warmpath/warmpath/scoring"
)

func TestSplit(t *testing.T) {
	tests := []struct {
		name string
		turn Turn
		want Causes
	}{
		{"first turn, nothing cached", Turn{Prompt: 1000}, Causes{CauseNew: 1000}},
		{"well-behaved second turn", Turn{Prompt: 1200, Cached: 992, Previous: 1000, Matched: 1000, Predicted: 992, BlockTokens: 16},
			Causes{CauseNew: 208}},
		{"well-behaved, counted in tokens", Turn{Prompt: 1200, Cached: 1000, Previous: 1000, Matched: 1000, Predicted: 1000},
			Causes{CauseNew: 200}},
		{"timestamp at token 37", Turn{Prompt: 1200, Cached: 32, Previous: 1000, Matched: 37, Predicted: 32, BlockTokens: 16},
			Causes{CauseClientBreak: 960, CauseNew: 208}},
		{"timestamp at token 37, counted in tokens", Turn{Prompt: 1200, Cached: 32, Previous: 1000, Matched: 37, Predicted: 32},
			Causes{CauseEvicted: 5, CauseClientBreak: 963, CauseNew: 200}},
		{"evicted", Turn{Prompt: 1200, Cached: 0, Previous: 1000, Matched: 1000},
			Causes{CauseEvicted: 1000, CauseNew: 200}},
		{"routed away for load", Turn{Prompt: 1200, Cached: 0, Previous: 1000, Matched: 1000, BestOther: 992, Route: RouteAway},
			Causes{CauseRoutedAway: 1000, CauseNew: 200}},
		{"routed away, other replica known", Turn{Prompt: 1200, Cached: 100, Previous: 1000, Matched: 1000, BestOther: 1000},
			Causes{CauseRoutedAway: 900, CauseNew: 200}},
		{"stale index", Turn{Prompt: 1200, Cached: 0, Previous: 1000, Matched: 1000, Predicted: 1000},
			Causes{CauseStaleIndex: 1000, CauseNew: 200}},
		{"cold replica after restart", Turn{Prompt: 1200, Cached: 0, Previous: 1000, Matched: 1000, Predicted: 496, Fresh: true},
			Causes{CauseColdReplica: 1000, CauseNew: 200}},
		{"session's replica lost", Turn{Prompt: 1200, Previous: 1000, Matched: 1000, Route: RouteLost},
			Causes{CauseColdReplica: 1000, CauseNew: 200}},
		{"shared system prompt on another replica, then break", Turn{Prompt: 1200, Cached: 0, Previous: 1000, Matched: 300, BestOther: 200},
			Causes{CauseRoutedAway: 200, CauseEvicted: 100, CauseClientBreak: 700, CauseNew: 200}},
		{"cached beyond the session", Turn{Prompt: 1200, Cached: 1100, Previous: 1000, Matched: 10}, Causes{CauseNew: 100}},
		{"fully cached", Turn{Prompt: 500, Cached: 500, Previous: 500, Matched: 500}, Causes{}},
		{"cached above prompt is clamped", Turn{Prompt: 10, Cached: 20}, Causes{}},
		{"negative inputs", Turn{Prompt: -5, Cached: -3, Previous: -1, Matched: -7, Predicted: -2, BestOther: -9}, Causes{}},
		{"predictions beyond the prompt", Turn{Prompt: 100, Predicted: 1 << 40, BestOther: 1 << 40}, Causes{CauseStaleIndex: 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Split(tt.turn); got != tt.want {
				t.Errorf("Split(%+v) = %v; want %v", tt.turn, got, tt.want)
			}
		})
	}
}

func TestRouteOf(t *testing.T) {
	for rebind, want := range map[string]Route{
		"": RouteStayed, scoring.RebindEvicted: RouteStayed, scoring.RebindDiverged: RouteStayed,
		scoring.RebindSaturated: RouteAway, scoring.RebindReserved: RouteAway, scoring.RebindRescored: RouteAway,
		scoring.RebindGone: RouteLost, scoring.RebindUnhealthy: RouteLost,
	} {
		if got := RouteOf(rebind); got != want {
			t.Errorf("RouteOf(%q) = %d; want %d", rebind, got, want)
		}
	}
}

func TestCauseNames(t *testing.T) {
	seen := map[string]bool{}
	for c := range NumCauses {
		s := c.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("cause %d has name %q", c, s)
		}
		seen[s] = true
	}
}

// FuzzSplit checks that the causes are never negative and sum exactly to
// the uncached tokens, whatever the inputs.
func FuzzSplit(f *testing.F) {
	f.Add(1200, 32, 1000, 37, 32, 0, false, uint8(0))
	f.Add(1200, 0, 1000, 1000, 992, 1000, true, uint8(1))
	f.Add(-1, 5, -100, 1<<40, -(1 << 40), 7, false, uint8(2))
	f.Fuzz(func(t *testing.T, prompt, cached, previous, matched, predicted, other int, fresh bool, route uint8) {
		turn := Turn{Prompt: prompt, Cached: cached, Previous: previous, Matched: matched,
			Predicted: predicted, BestOther: other, Fresh: fresh, Route: Route(route % 3), BlockTokens: int(route % 33)}
		got := Split(turn)
		p := max(0, prompt)
		want := p - min(max(0, cached), p)
		if got.Total() != want {
			t.Fatalf("Split(%+v) = %v, total %d; want %d", turn, got, got.Total(), want)
		}
		if cached >= 0 && cached <= prompt && got.Total() != prompt-cached {
			t.Fatalf("Split(%+v) total %d; want prompt − cached = %d", turn, got.Total(), prompt-cached)
		}
		for c, v := range got {
			if v < 0 {
				t.Fatalf("Split(%+v)[%v] = %d", turn, Cause(c), v)
			}
		}
	})
}
