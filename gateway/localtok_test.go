package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/internal/testrun"
	"github.com/warmpath/warmpath/scoring"
	"github.com/warmpath/warmpath/vllmsim"
)

// tokenizeProxy fronts a simulated replica, counts the /tokenize calls
// it passes on and, with skew set, answers them with the 4th id changed:
// a replica whose tokenizer disagrees with the gateway's.
type tokenizeProxy struct {
	URL      string
	tokenize atomic.Int64
	skew     atomic.Bool
}

func newTokenizeProxy(t *testing.T, target string) *tokenizeProxy {
	t.Helper()
	u, err := neturl.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &tokenizeProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/tokenize" || resp.StatusCode != http.StatusOK || !p.skew.Load() {
			return nil
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var ans map[string]any
		if err := json.Unmarshal(raw, &ans); err != nil {
			return err
		}
		if ids, _ := ans["tokens"].([]any); len(ids) > 3 {
			ids[3] = ids[3].(float64) + 1
		}
		raw, _ = json.Marshal(ans)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
		resp.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			p.tokenize.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// localTokenizerGateway runs a precise-prefix gateway with routing.tokenizer
// "simulator" (a check every 4th prompt) in front of two simulated
// replicas behind tokenizeProxies.
func localTokenizerGateway(t *testing.T) (*testGateway, []*tokenizeProxy, *logCapture) {
	t.Helper()
	f := startSim(t, vllmsim.Config{Replicas: 2})
	var specs []fleet.ReplicaSpec
	var proxies []*tokenizeProxy
	for _, r := range f.Replicas() {
		p := newTokenizeProxy(t, r.Info().URL)
		s := specOf(r)
		s.URL = p.URL
		specs, proxies = append(specs, s), append(proxies, p)
	}
	cfg := engineConfig(scoring.PolicyPrecisePrefix, specs...)
	cfg.Routing.Tokenizer = TokenizerSimulator
	cfg.Routing.TokenizerVerifyEvery = 4
	g, logs := startLoggedGateway(t, cfg)
	return g, proxies, logs
}

func tokenizeCalls(ps []*tokenizeProxy) (n int64) {
	for _, p := range ps {
		n += p.tokenize.Load()
	}
	return n
}

// With routing.tokenizer "simulator", fresh prompts are tokenized in
// process with the replicas' own ids (the prompt length the router used
// is the one the replica reports); the first prompt and every 4th are
// checked against a replica's /tokenize, and those checks are the only
// /tokenize calls.
func TestLocalTokenizerMatchesReplicas(t *testing.T) {
	g, proxies, _ := localTokenizerGateway(t)
	for i := range 8 {
		r := routed(t, g.URL, userPrompt(fmt.Sprintf("loc%dw", i), 60+i))
		if got := r.Header.Get("X-Warmpath-Prompt-Tokens"); got != strconv.Itoa(r.Usage.PromptTokens) {
			t.Errorf("prompt %d: router used %s prompt tokens; the replica counted %d", i, got, r.Usage.PromptTokens)
		}
	}
	checks := func(result string) float64 {
		return counter(t, g.obs.reg, "warmpath_tokenizer_checks_total", map[string]string{"result": result})
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return checks("match") == 3 }, "checks of prompts 1, 4 and 8")
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "local"}); got != 8 {
		t.Errorf("local tokenizations = %v; want 8", got)
	}
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "ok"}); got != 0 {
		t.Errorf("tokenizations by a replica = %v; want none", got)
	}
	if n := tokenizeCalls(proxies); n != 3 {
		t.Errorf("%d /tokenize calls; want the 3 checks", n)
	}
	if m := checks("mismatch") + checks("failed") + checks("dropped"); m != 0 {
		t.Errorf("%v checks did not match", m)
	}
}

// A fleet whose /tokenize disagrees with the in-process tokenizer: the
// first prompt's check finds it, logs the position once, counts it for
// the model, and the model's prompts are tokenized by the replicas from
// then on.
func TestLocalTokenizerMismatchFallsBack(t *testing.T) {
	g, proxies, logs := localTokenizerGateway(t)
	for _, p := range proxies {
		p.skew.Store(true)
	}
	routed(t, g.URL, userPrompt("skew0w", 50))
	mismatches := func() float64 {
		return counter(t, g.obs.reg, "warmpath_tokenizer_mismatch_total", map[string]string{"model": "qwen3-32b"})
	}
	testrun.Eventually(t, 10*time.Second, func() bool { return mismatches() == 1 }, "the first prompt's check to mismatch")
	for i := 1; i < 4; i++ {
		routed(t, g.URL, userPrompt(fmt.Sprintf("skew%dw", i), 50))
	}
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "local"}); got != 1 {
		t.Errorf("local tokenizations = %v; want only the first prompt's", got)
	}
	if got := counter(t, g.obs.reg, "warmpath_tokenizer_calls_total", map[string]string{"result": "ok"}); got != 3 {
		t.Errorf("tokenizations by a replica = %v; want the 3 after the mismatch", got)
	}
	if n := tokenizeCalls(proxies); n != 4 {
		t.Errorf("%d /tokenize calls; want the check and 3 prompts", n)
	}
	if got := mismatches(); got != 1 {
		t.Errorf("mismatches = %v; want 1", got)
	}
	lines := logs.matching("the in-process tokenizer disagrees")
	if len(lines) != 1 || !bytes.Contains([]byte(lines[0]), []byte("position=3")) {
		t.Errorf("mismatch logs = %q; want one naming position 3", lines)
	}
}
