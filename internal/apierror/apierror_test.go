package apierror

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
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
