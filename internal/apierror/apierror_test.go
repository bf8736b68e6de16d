package apierror

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantType   string
		wantCode   any
		wantParam  any
		retryAfter string
	}{
		{"bad request", BadRequest("model", "you must provide a model"), 400, TypeInvalidRequest, nil, "model", ""},
		{"wrapped not found", fmt.Errorf("x: %w", NotFound("model_not_found", "no")), 404, TypeInvalidRequest, "model_not_found", nil, ""},
		{"unavailable", Unavailable(nil, "down"), 503, TypeServer, "service_unavailable", nil, "1"},
		{"deadline", context.DeadlineExceeded, 504, TypeServer, "timeout", nil, ""},
		{"max bytes", &http.MaxBytesError{Limit: 10}, 413, TypeInvalidRequest, "request_too_large", nil, ""},
		{"anything", fmt.Errorf("boom"), 500, TypeServer, nil, nil, ""},
		{"own retry-after kept", &Error{Status: 503, Type: TypeServer, Msg: "m", Header: http.Header{"Retry-After": {"7"}}}, 503, TypeServer, nil, nil, "7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			he := Write(rec, tt.err)
			if rec.Code != tt.wantStatus || he.Status != tt.wantStatus {
				t.Fatalf("status = %d (%d); want %d", rec.Code, he.Status, tt.wantStatus)
			}
			var env map[string]map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			e := env["error"]
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e[k]; !ok {
					t.Errorf("envelope lacks %q: %s", k, rec.Body)
				}
			}
			if e["type"] != tt.wantType || e["code"] != tt.wantCode || e["param"] != tt.wantParam {
				t.Errorf("envelope = %v; want type %v code %v param %v", e, tt.wantType, tt.wantCode, tt.wantParam)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q; want %q", got, tt.retryAfter)
			}
		})
	}
}

func TestWriteClientClosedWritesNothing(t *testing.T) {
	rec := httptest.NewRecorder()
	if he := Write(rec, fmt.Errorf("x: %w", context.Canceled)); he.Status != StatusClientClosed {
		t.Fatalf("status = %d; want 499", he.Status)
	}
	if rec.Body.Len() != 0 {
		t.Errorf("wrote %q to a client that has gone", rec.Body)
	}
}

// An upstream error response becomes the error it stands for: status,
// envelope fields (an integer code dropped), a message from whichever
// shape the body has, and only the retry headers.
func TestFromResponse(t *testing.T) {
	for _, tt := range []struct {
		name, body          string
		status              int
		header              http.Header
		msg, typ, code, prm string
		keep, drop          string
	}{
		{"openai", `{"error":{"message":"Rate limit reached","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`, 429,
			http.Header{"Retry-After": {"7"}, "X-Ratelimit-Remaining-Requests": {"0"}, "Server": {"uvicorn"}},
			"Rate limit reached", "rate_limit_error", "rate_limit_exceeded", "", "Retry-After", "Server"},
		{"param", `{"error":{"message":"bad","type":"invalid_request_error","param":"messages","code":400}}`, 400, nil,
			"bad", "invalid_request_error", "", "messages", "", ""},
		{"vllm's older shape", `{"object":"error","message":"too long","type":"BadRequestError","code":400}`, 400, nil,
			"too long", TypeInvalidRequest, "", "", "", ""},
		{"text", "upstream connect error", 503, nil, "upstream connect error", TypeServer, "", "", "", ""},
		{"empty", "", 502, nil, "the model answered 502 Bad Gateway", TypeServer, "", "", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == nil {
				h = http.Header{}
			}
			e := FromResponse(&http.Response{StatusCode: tt.status, Header: h, Body: io.NopCloser(strings.NewReader(tt.body))})
			if e.Status != tt.status || e.Msg != tt.msg || e.Type != tt.typ || e.Code != tt.code || e.Param != tt.prm {
				t.Errorf("FromResponse = %d %q %q code %q param %q; want %d %q %q %q %q", e.Status, e.Msg, e.Type, e.Code, e.Param,
					tt.status, tt.msg, tt.typ, tt.code, tt.prm)
			}
			if tt.keep != "" && e.Header.Get(tt.keep) == "" {
				t.Errorf("header %s dropped", tt.keep)
			}
			if tt.drop != "" && e.Header.Get(tt.drop) != "" {
				t.Errorf("header %s kept", tt.drop)
			}
		})
	}
}
