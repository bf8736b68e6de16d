package routing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/tokenizer/hftok"
	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// routing.tokenizer's values: the replicas' /tokenize (the default, also
// ""), the simulated model's vocabulary tokenized in process, and each
// model's Hugging Face tokenizer files (routing.tokenizer_dirs) loaded
// in process.
const (
	TokenizerReplicas  = "replicas"
	TokenizerSimulator = "simulator"
	TokenizerHF        = "hf"
)

// localTokenizer tokenizes in process, giving the ids a replica's
// /tokenize would for the body the gateway would send it
// (request.R.TokenizeBody). It takes the parts of the request
// request.Parse validated, not that body:
// building and parsing a copy of a 16k-token prompt cost about a tenth
// more time and twice the allocation (BenchmarkLocalTokens, 833e6ee: 0.88
// against 0.98 ms, 305 against 641 KiB). A check sends the replica the body.
type localTokenizer interface {
	request.Tokenizer
	// Serves reports whether it tokenizes model's prompts at all.
	Serves(model string) bool
}

// simulatorTokenizer is the simulator's /tokenize code itself (package
// tokenizer/simtok).
type simulatorTokenizer struct{}

func (simulatorTokenizer) Chat(_, messages, tools string) ([]uint32, error) {
	return simtok.TokenizeChatJSON(messages, tools)
}

func (simulatorTokenizer) Prompt(_, text string) ([]uint32, error) {
	return simtok.TokenizePrompt(text), nil
}

// Serves: every simulated replica tokenizes alike, whatever the model.
func (simulatorTokenizer) Serves(string) bool { return true }

// hfTokenizers tokenizes each model of routing.tokenizer_dirs with its
// own tokenizer.json and chat template (package hftok); other models'
// bodies are refused, so the replicas tokenize them.
type hfTokenizers map[string]*hftok.Tokenizer

var errNoModelTokenizer = errors.New("gateway: no tokenizer files for this model (routing.tokenizer_dirs)")

func (h hfTokenizers) Chat(model, messages, tools string) ([]uint32, error) {
	tok := h[model]
	if tok == nil {
		return nil, errNoModelTokenizer
	}
	return tok.TokenizeChat(gjson.Parse(messages), gjson.Parse(tools))
}

func (h hfTokenizers) Prompt(model, text string) ([]uint32, error) {
	tok := h[model]
	if tok == nil {
		return nil, errNoModelTokenizer
	}
	return tok.TokenizePrompt(text)
}

// Serves reports whether model has tokenizer files.
func (h hfTokenizers) Serves(model string) bool { return h[model] != nil }

// newLocalTokenizer returns routing.tokenizer's tokenizer, nil for none;
// for hf it loads every model's files, failing on the first that is
// missing, malformed or uses what hftok does not support.
func newLocalTokenizer(kind string, dirs map[string]string) (localTokenizer, error) {
	switch kind {
	case TokenizerSimulator:
		return simulatorTokenizer{}, nil
	case TokenizerHF:
		h := make(hfTokenizers, len(dirs))
		for model, dir := range dirs {
			tok, err := hftok.Load(dir)
			if err != nil {
				return nil, fmt.Errorf("routing.tokenizer_dirs[%q]: %w", model, err)
			}
			h[model] = tok
		}
		return h, nil
	}
	return nil, nil
}

// localTokens is the in-process tokenizer and what its checks found.
// A model's first prompt, and then one in every (a sampled check), is
// also tokenized by a replica off the request path (checker); ids that
// differ stop the in-process tokenizer for that model until the gateway
// restarts, which the log says once with the first differing position.
// A check that gets no answer counts as failed and changes nothing (the
// first prompt's is tried again with the next prompt).
type localTokens struct {
	impl    localTokenizer
	every   uint64   // sampled check period; 0 checks only a model's first prompt
	checker *workers // one worker: checks are cheap and may be dropped
	models  sync.Map // model → *localModel
}

// localModel is one model's state.
type localModel struct {
	n       atomic.Uint64 // prompts tokenized in process
	checked atomic.Bool   // a check matched
	pending atomic.Bool   // the first prompt's check is queued or running
	off     atomic.Bool   // a check mismatched: the replicas tokenize it
}

const checkBacklog = 64

func newLocalTokens(impl localTokenizer, every int) *localTokens {
	return &localTokens{impl: impl, every: uint64(max(every, 0)), checker: newWorkers(1, checkBacklog, 0)}
}

func (l *localTokens) model(name string) *localModel {
	if v, ok := l.models.Load(name); ok {
		return v.(*localModel)
	}
	v, _ := l.models.LoadOrStore(name, new(localModel))
	return v.(*localModel)
}

// Run runs the checker until ctx ends.
func (l *localTokens) Run(ctx context.Context) error { return l.checker.Run(ctx) }

// wantCheck reports whether this prompt of lm is to be checked, and
// whether it is the first prompt's check.
func (l *localTokens) wantCheck(lm *localModel) (check, first bool) {
	n := lm.n.Add(1)
	if !lm.checked.Load() && lm.pending.CompareAndSwap(false, true) {
		return true, true
	}
	return l.every > 0 && n%l.every == 0, false
}

// LocalIDs returns r's ids from the in-process tokenizer without any
// check, false when its model has none (or it refused the prompt).
func (t *Tokenizer) LocalIDs(r *request.R) ([]uint32, bool) {
	if !t.LocalFor(r.Model()) {
		return nil, false
	}
	ids, err := r.LocalTokens(t.localTok.impl)
	return ids, err == nil
}

// LocalFor reports whether model's prompts are tokenized in process.
func (t *Tokenizer) LocalFor(model string) bool {
	l := t.localTok
	return l != nil && l.impl.Serves(model) && !l.model(model).off.Load()
}

// local returns r's ids from the in-process tokenizer, when there is one
// for its model, queueing a check when one is due. ok is false when the
// replicas are to be asked: no local tokenizer, the model's turned off,
// or it refused the prompt.
func (t *Tokenizer) local(r *request.R, reps []*fleet.Replica) (ids []uint32, ok bool) {
	l := t.localTok
	if l == nil {
		return nil, false
	}
	lm := l.model(r.Model())
	if lm.off.Load() {
		return nil, false
	}
	ids, err := r.LocalTokens(l.impl)
	if err != nil {
		return nil, false // the replica answers it, or says why not
	}
	t.m.calls.WithLabelValues("local").Inc()
	if check, first := l.wantCheck(lm); check && len(reps) > 0 {
		t.checkLater(r.Model(), lm, first, r.TokenizeBody(), ids, reps)
	} else if first {
		lm.pending.Store(false)
	}
	return ids, true
}

// checkLater queues a comparison of ids with a replica's /tokenize of
// body, or drops it when the checker's backlog is full.
func (t *Tokenizer) checkLater(model string, lm *localModel, first bool, body []byte, ids []uint32, reps []*fleet.Replica) {
	job := func(ctx context.Context) {
		if first {
			defer lm.pending.Store(false)
		}
		t.check(ctx, model, lm, body, ids, reps)
	}
	if !t.localTok.checker.try(job) {
		if first {
			lm.pending.Store(false)
		}
		t.m.checks.WithLabelValues("dropped").Inc()
	}
}

// check asks a replica to tokenize body and compares its ids with ids.
func (t *Tokenizer) check(ctx context.Context, model string, lm *localModel, body []byte, ids []uint32, reps []*fleet.Replica) {
	want, err := t.ask(ctx, t.order(reps), body)
	if err != nil {
		t.m.checks.WithLabelValues("failed").Inc()
		t.log.Debug("tokenizer: check of the in-process tokenizer got no answer", "model", model, "err", err)
		return
	}
	i := firstDiff(ids, want)
	if i < 0 {
		lm.checked.Store(true)
		t.m.checks.WithLabelValues("match").Inc()
		return
	}
	t.m.checks.WithLabelValues("mismatch").Inc()
	t.m.mismatch.WithLabelValues(model).Inc()
	if lm.off.Swap(true) {
		return // logged by the first mismatch
	}
	t.log.Error("tokenizer: the in-process tokenizer disagrees with the replicas' /tokenize; asking the replicas for this model from now on",
		"model", model, "position", i, "local", idAt(ids, i), "replica", idAt(want, i), "local_tokens", len(ids), "replica_tokens", len(want))
}

// firstDiff returns the first position where a and b differ (the shorter
// one's length when one is a prefix of the other), or -1 when equal.
func firstDiff(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// idAt renders ids[i], or "end" past the end, for the mismatch log.
func idAt(ids []uint32, i int) string {
	if i >= len(ids) {
		return "end"
	}
	return fmt.Sprint(ids[i])
}
