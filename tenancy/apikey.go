package tenancy

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
)

// Key format: "wp-" + 16 hex digits of id + "-" + 64 hex digits of secret.
const (
	keyPrefix    = "wp-"
	keyIDLen     = 16
	keySecretLen = 64
	keyLen       = len(keyPrefix) + keyIDLen + 1 + keySecretLen
	// maxTokenLen bounds any credential we look at; longer is malformed.
	maxTokenLen = 8192
)

// newKeyMaterial returns a fresh key id, its secret and the full key.
func newKeyMaterial() (id, secret, full string) {
	var b [8 + 32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	id = hex.EncodeToString(b[:8])
	secret = hex.EncodeToString(b[8:])
	return id, secret, keyPrefix + id + "-" + secret
}

// parseKey splits a wp- key into its id and secret; ok is false for anything
// not of exactly that form.
func parseKey(tok string) (id, secret string, ok bool) {
	if len(tok) != keyLen || !strings.HasPrefix(tok, keyPrefix) || tok[len(keyPrefix)+keyIDLen] != '-' {
		return "", "", false
	}
	id = tok[len(keyPrefix) : len(keyPrefix)+keyIDLen]
	secret = tok[len(keyPrefix)+keyIDLen+1:]
	if !isLowerHex(id) || !isLowerHex(secret) {
		return "", "", false
	}
	return id, secret, true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hashSecret is the stored form of a secret: hex SHA-256.
func hashSecret(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// secretMatches compares secret's hash with the stored hex hash in constant
// time.
func secretMatches(secret, storedHex string) bool {
	h := sha256.Sum256([]byte(secret))
	var want [sha256.Size]byte
	if len(storedHex) != 2*sha256.Size {
		return false
	}
	if _, err := hex.Decode(want[:], []byte(storedHex)); err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(h[:], want[:]) == 1
}

// credential returns the bearer credential of r: "Authorization: Bearer
// <tok>" (scheme case-insensitive), else "x-api-key: <tok>" as Anthropic
// clients send it. present is false when r carries neither header; tok is ""
// when one is present but unusable (empty, oversized, wrong scheme, control
// characters).
func credential(h http.Header) (tok string, present bool) {
	if v := h.Values("Authorization"); len(v) > 0 {
		if len(v) > 1 {
			return "", true
		}
		scheme, rest, ok := strings.Cut(v[0], " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return "", true
		}
		return cleanToken(rest), true
	}
	if v := h.Values("X-Api-Key"); len(v) > 0 {
		if len(v) > 1 {
			return "", true
		}
		return cleanToken(v[0]), true
	}
	return "", false
}

func cleanToken(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxTokenLen {
		return ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return ""
		}
	}
	return s
}

// looksLikeJWT reports whether tok has a JWT's three dot-separated parts.
func looksLikeJWT(tok string) bool {
	return strings.Count(tok, ".") == 2 && !strings.HasPrefix(tok, keyPrefix)
}
