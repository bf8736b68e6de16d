package chatapi

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// ReadBody reads r's body, at most limit bytes. Its errors are values for
// the front to render in its own envelope: an *http.MaxBytesError past
// the limit, else the body's read error (a timeout, a client gone). A
// body whose length the client declared is read into one buffer of that
// size (net/http ends the body there): io.ReadAll grows its buffer from
// 512 bytes, which for a 16k-token prompt (~100 KB) is a dozen
// allocations and copies.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	n := r.ContentLength
	if n <= 0 || n > limit {
		return io.ReadAll(body)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// Marshal is json.Marshal without HTML escaping, so text and tool
// arguments keep their bytes (<, >, & stay as they are).
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// WriteJSON answers with v as JSON (Marshal), a newline and status.
// Headers set on w before it go too.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	b, err := Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// RequestID gives every response an X-Request-Id, the client's if it sent
// a sane one (printable ASCII, at most 128 bytes), else NewRequestID's,
// and sets it on the request too, so that it is passed on to the engine,
// which logs it. The OpenAI and Anthropic SDKs surface it in errors.
func RequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
			id = NewRequestID()
		}
		w.Header().Set("X-Request-Id", id)
		r.Header.Set("X-Request-Id", id)
		next.ServeHTTP(w, r)
	})
}

// NewRequestID returns a new random request id, "req_" and 24 hex digits.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}
