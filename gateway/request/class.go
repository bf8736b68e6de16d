package request

import (
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// parseClass reads what chooses the request's class (the service_tier
// field, st, and the X-Warmpath-Priority header) and derives it with the
// sender's default and ceiling (fairq.DeriveClass). The Responses API's
// background flag comes later, through SetBackground.
func (r *R) parseClass(st gjson.Result) error {
	if st.Exists() && st.Type != gjson.Null {
		if st.Type != gjson.String {
			return apierror.BadRequest("service_tier", "service_tier must be a string")
		}
		r.serviceTier = st.String()
	}
	return r.deriveClass()
}

// deriveClass sets r.class from what the request says and who sent it.
func (r *R) deriveClass() error {
	def, ceiling := principalClasses(r.principal)
	c, err := fairq.DeriveClass(r.serviceTier, r.background, r.header.Get(fairq.HeaderPriority), def, ceiling)
	if err != nil {
		return err
	}
	r.class = c
	return nil
}

// principalClasses returns the sender's default class and ceiling;
// interactive for both without a principal (or with a class tenancy does
// not know, which its validation prevents).
func principalClasses(p *tenancy.Principal) (def, ceiling fairq.Class) {
	if p == nil {
		return fairq.Interactive, fairq.Interactive
	}
	parse := func(s string) fairq.Class {
		if c, err := fairq.ParseClass(s); err == nil && strings.TrimSpace(s) != "" {
			return c
		}
		return fairq.Interactive
	}
	return parse(p.DefaultClass), parse(p.ClassCeiling)
}

// Class returns the request's scheduling class: from its service_tier,
// the Responses API's background flag (SetBackground), the
// X-Warmpath-Priority header or the tenant's default, capped by the
// tenant's or key's ceiling.
func (r *R) Class() fairq.Class { return r.class }

// SetBackground records the Responses API's "background" flag, which
// makes the request Background unless its service_tier says otherwise
// (still capped by the sender's ceiling).
func (r *R) SetBackground(background bool) {
	r.background = background
	// The tier and header were validated by Parse, so this cannot
	// fail.
	_ = r.deriveClass()
}

// classBody applies the class to the upstream body: a client's own
// "priority" field is dropped (vLLM would obey it, and only the gateway
// may choose it), and with vllmPriority (queue.vllm_priority) a
// Background request carries vLLM's priority 1 (lower runs first;
// Interactive is vLLM's default 0, so it needs no field).
func (r *R) classBody(body []byte, vllmPriority bool) ([]byte, error) {
	var err error
	if r.top.priority {
		if body, err = sjson.DeleteBytes(body, "priority"); err != nil {
			return nil, err
		}
	}
	if p := r.class.VLLMPriority(); vllmPriority && p != 0 {
		// Absent now either way: appended without a scan of the body.
		body = appendFields(body, appendField(nil, "priority", p))
	}
	return body, nil
}
