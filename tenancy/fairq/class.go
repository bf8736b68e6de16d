package fairq

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/warmpath/warmpath/internal/apierror"
)

// Class is a request's scheduling class. Smaller is more urgent, as vLLM's
// priority is; the zero value is Interactive.
type Class uint8

// Classes, most urgent first.
const (
	Interactive Class = iota // a person is waiting on the turn (the default)
	Background               // an autonomous run, batch or flex-tier work
	numClasses
)

// HeaderPriority is the request header that may choose a class.
const HeaderPriority = "X-Warmpath-Priority"

// String returns "interactive" or "background" ("class(N)" for an invalid
// value).
func (c Class) String() string {
	switch c {
	case Interactive:
		return "interactive"
	case Background:
		return "background"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// VLLMPriority is the value to send as vLLM's request field "priority"
// (lower runs first under --scheduling-policy priority): 0 for Interactive,
// 1 for Background. vLLM rejects a non-zero priority with a 400 unless the
// engine runs priority scheduling, so send it only to such engines.
func (c Class) VLLMPriority() int { return int(min(c, Background)) }

// ParseClass parses "interactive" or "background" (case and surrounding
// space ignored).
func ParseClass(s string) (Class, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive":
		return Interactive, nil
	case "background":
		return Background, nil
	}
	return 0, fmt.Errorf("fairq: unknown class %q (want interactive or background)", s)
}

// DeriveClass returns a request's class: the first of these that applies,
// then capped by ceiling (a request is never more urgent than its tenant or
// key allows, so a key limited to Background cannot send Interactive):
//
//  1. serviceTier, the request's "service_tier": "flex" → Background,
//     "priority" → Interactive; "", "auto", "default" and "scale" say
//     nothing;
//  2. background, the Responses API's "background": true → Background;
//  3. header, the X-Warmpath-Priority header: "interactive" or
//     "background"; "" says nothing;
//  4. tenantDefault.
//
// An unknown service tier or header value is a 400 invalid_request_error
// (*apierror.Error) naming the offending parameter. Class values beyond
// Background count as Background.
func DeriveClass(serviceTier string, background bool, header string, tenantDefault, ceiling Class) (Class, error) {
	c, ok, err := tierClass(serviceTier)
	if err != nil {
		return 0, err
	}
	if !ok && background {
		c, ok = Background, true
	}
	if !ok && strings.TrimSpace(header) != "" {
		hc, err := ParseClass(header)
		if err != nil {
			return 0, apierror.BadRequest(HeaderPriority, "%s must be interactive or background, not %s", HeaderPriority, quoteShort(header))
		}
		c, ok = hc, true
	}
	if !ok {
		c = tenantDefault
	}
	return min(max(c, ceiling), Background), nil
}

// tierClass maps OpenAI's service_tier onto a class; ok is false for the
// tiers that say nothing about urgency.
func tierClass(tier string) (c Class, ok bool, err error) {
	switch tier {
	case "", "auto", "default", "scale":
		return 0, false, nil
	case "flex":
		return Background, true, nil
	case "priority":
		return Interactive, true, nil
	}
	return 0, false, apierror.BadRequest("service_tier", "service_tier must be one of auto, default, flex, scale, priority, not %s", quoteShort(tier))
}

// quoteShort quotes at most the first 32 bytes of a client-supplied s, for
// error messages of bounded length.
func quoteShort(s string) string {
	if len(s) > 32 {
		return strconv.Quote(s[:32]) + "…"
	}
	return strconv.Quote(s)
}
