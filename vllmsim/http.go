package vllmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/warmpath/warmpath/tokenizer/simtok"
)

// maxBody bounds request bodies (a 131k-token prompt is about 1 MB of text).
const maxBody = 64 << 20

// apiError is an error answered in vLLM's shape
// {"error":{"message","type","param","code":<status>}}.
type apiError struct {
	status int
	msg    string
	param  string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// errorType is vLLM's error type name for a status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		if status >= 500 {
			return "InternalServerError"
		}
		return "BadRequestError"
	}
}

// errorBody is the JSON of an error response or mid-stream error event.
func errorBody(status int, msg, param string) []byte {
	var p any
	if param != "" {
		p = param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": errorType(status), "param": p, "code": status,
	}})
	return b
}

// writeError is the one writer of error responses.
func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.status)
	_, _ = w.Write(errorBody(ae.status, ae.msg, ae.param))
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// decodeBody reads a JSON request body into v, answering vLLM-style 400s.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return badRequest("reading request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("JSON decode error: %v", err)
	}
	return nil
}

// handlerFunc is a handler that returns its error; serveErr writes it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func serveErr(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, err)
		}
	}
}

// noteTrace remembers each request's traceparent for LastTraceparent.
func (r *Replica) noteTrace(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		tp := req.Header.Get("Traceparent")
		r.traceparent.Store(&tp)
		h.ServeHTTP(w, req)
	})
}

// routes builds the replica's HTTP surface.
func (r *Replica) routes(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/chat/completions", r.noteTrace(serveErr(r.handleChat)))
	mux.Handle("POST /v1/completions", r.noteTrace(serveErr(r.handleCompletions)))
	mux.Handle("GET /v1/models", serveErr(r.handleModels))
	if r.cfg.NoTokenize {
		notFound := func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"detail":"Not Found"}`)) // FastAPI's, as a route vLLM does not serve
		}
		mux.HandleFunc("POST /tokenize", notFound)
		mux.HandleFunc("POST /detokenize", notFound)
	} else {
		mux.Handle("POST /tokenize", serveErr(r.handleTokenize))
		mux.Handle("POST /detokenize", serveErr(r.handleDetokenize))
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]string{"version": "0.26.0+vllmsim"})
	})
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		for _, rk := range r.ranks {
			rk.eng.resetPrefixCache()
		}
		w.WriteHeader(http.StatusOK)
	})
	admin := http.NewServeMux()
	admin.Handle("GET /sim/faults", serveErr(r.handleGetFaults))
	admin.Handle("POST /sim/faults", serveErr(r.handleSetFaults))
	admin.HandleFunc("POST /sim/restart", func(w http.ResponseWriter, _ *http.Request) {
		r.Restart()
		w.WriteHeader(http.StatusOK)
	})
	admin.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, r.Stats()) })
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/sim/") {
			admin.ServeHTTP(w, req)
			return
		}
		if r.faults.Load().unhang != nil {
			// Read the body first so that the server notices a client that
			// gives up (net/http watches the connection only once the body
			// is consumed).
			body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
			if err != nil {
				return
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			if r.waitHang(req.Context()) != nil {
				return // the client gave up while the replica hung
			}
		}
		mux.ServeHTTP(w, req)
	})
}

// faultsJSON is the body of /sim/faults.
type faultsJSON struct {
	ErrorRate      float64 `json:"error_rate"`
	ExtraLatencyMs float64 `json:"extra_latency_ms"`
	Hang           bool    `json:"hang"`
}

func (r *Replica) handleGetFaults(w http.ResponseWriter, _ *http.Request) error {
	f := r.Faults()
	writeJSON(w, faultsJSON{ErrorRate: f.ErrorRate, ExtraLatencyMs: float64(f.ExtraLatency) / 1e6, Hang: f.Hang})
	return nil
}

func (r *Replica) handleSetFaults(w http.ResponseWriter, req *http.Request) error {
	var fj faultsJSON
	if err := decodeBody(req, &fj); err != nil {
		return err
	}
	if fj.ErrorRate < 0 || fj.ErrorRate > 1 || fj.ExtraLatencyMs < 0 {
		return badRequest("error_rate must be in [0,1] and extra_latency_ms ≥ 0")
	}
	r.SetFaults(Faults{ErrorRate: fj.ErrorRate, ExtraLatency: time.Duration(fj.ExtraLatencyMs * 1e6), Hang: fj.Hang})
	return r.handleGetFaults(w, req)
}

// checkModel answers 404 for a model this replica does not serve; an empty
// model means the served one.
func (r *Replica) checkModel(model string) error {
	if model != "" && model != r.cfg.Model {
		return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model), param: "model"}
	}
	return nil
}

func (r *Replica) handleModels(w http.ResponseWriter, _ *http.Request) error {
	m := r.cfg.Model
	writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": m, "object": "model", "created": r.created, "owned_by": "vllm", "root": m, "parent": nil,
		"max_model_len": r.cfg.Profile.MaxModelLen,
		"permission": []any{map[string]any{
			"id": "modelperm-" + m, "object": "model_permission", "created": r.created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
			"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
			"organization": "*", "group": nil, "is_blocking": false,
		}},
	}}})
	return nil
}

func (r *Replica) handleTokenize(w http.ResponseWriter, req *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, req.Body, maxBody))
	if err != nil {
		return badRequest("reading request body: %v", err)
	}
	tr, err := simtok.DecodeTokenizeRequest(body, true)
	if err != nil {
		return badRequest("%v", err) // simtok's errors are /tokenize's 400s
	}
	if err := r.checkModel(tr.Model); err != nil {
		return err
	}
	toks, err := tr.Tokens()
	if err != nil {
		return badRequest("%v", err)
	}
	resp := map[string]any{"count": len(toks), "max_model_len": r.cfg.Profile.MaxModelLen, "tokens": nonNil(toks)}
	if tr.ReturnTokenStrs {
		strs := make([]string, len(toks))
		for i, t := range toks {
			strs[i] = TokenString(t)
		}
		resp["token_strs"] = strs
	}
	writeJSON(w, resp)
	return nil
}

func (r *Replica) handleDetokenize(w http.ResponseWriter, req *http.Request) error {
	var dr struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := decodeBody(req, &dr); err != nil {
		return err
	}
	if err := r.checkModel(dr.Model); err != nil {
		return err
	}
	for _, t := range dr.Tokens {
		if t >= VocabSize {
			return badRequest("token id %d out of vocabulary (size %d)", t, VocabSize)
		}
	}
	writeJSON(w, map[string]string{"prompt": Detokenize(dr.Tokens)})
	return nil
}

// nonNil makes an empty token list marshal as [] rather than null.
func nonNil(t []uint32) []uint32 {
	if t == nil {
		return []uint32{}
	}
	return t
}
