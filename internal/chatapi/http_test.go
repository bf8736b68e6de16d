package chatapi

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadBody(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		n     int64 // declared length; -1 unknown
		limit int64
		want  string
		err   bool
	}{
		{"declared", "hello", 5, 10, "hello", false},
		{"unknown length", "hello", -1, 10, "hello", false},
		{"over the limit", "hello world", -1, 5, "", true},
		{"declared over the limit", "hello world", 11, 5, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.body))
			r.ContentLength = tt.n
			got, err := ReadBody(httptest.NewRecorder(), r, tt.limit)
			if tt.err {
				if _, ok := errors.AsType[*http.MaxBytesError](err); !ok {
					t.Fatalf("err = %v; want *http.MaxBytesError", err)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	boom := errors.New("boom")
	r := httptest.NewRequest(http.MethodPost, "/", iotest.ErrReader(boom))
	if _, err := ReadBody(httptest.NewRecorder(), r, 10); !errors.Is(err, boom) {
		t.Fatalf("read error: %v; want boom", err)
	}
}

func TestWriteJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	if err := WriteJSON(rec, http.StatusCreated, map[string]string{"a": "<b>&"}); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Body.String(), "{\"a\":\"<b>&\"}\n"; got != want {
		t.Fatalf("body %q; want %q", got, want)
	}
	if rec.Code != http.StatusCreated || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("code %d, Content-Type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}

func TestRequestID(t *testing.T) {
	var seen string
	h := RequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = r.Header.Get("X-Request-Id") }))
	for _, tt := range []struct{ sent, want string }{
		{"abc-123", "abc-123"},
		{"", ""},
		{"has space", ""},
		{strings.Repeat("x", 129), ""},
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Request-Id", tt.sent)
		h.ServeHTTP(rec, r)
		got := rec.Header().Get("X-Request-Id")
		if got != seen {
			t.Errorf("response id %q, request id %q; want equal", got, seen)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("sent %q: got %q; want it kept", tt.sent, got)
		}
		if tt.want == "" && (!strings.HasPrefix(got, "req_") || len(got) != 28) {
			t.Errorf("sent %q: got %q; want a new req_ id", tt.sent, got)
		}
	}
}
