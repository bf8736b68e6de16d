package scoring

// Rebind reasons returned by Stick.
const (
	RebindGone      = "gone"      // the bound endpoint is not among the eligible ones
	RebindSaturated = "saturated" // it is saturated
	RebindEvicted   = "evicted"   // it no longer holds the session's prefix
)

// Stick decides whether a sticky session stays on its bound endpoint: it
// does while the endpoint is eligible, unsaturated (or every endpoint is
// saturated, when moving would only trade a warm queue for a cold one) and
// still holds the session's prefix. It returns the endpoint's index, or -1 and why the
// session must be rebound ("" when it was not bound). holds reports whether
// eps[i] still holds the session's prefix; nil means it does.
func Stick(bound string, eps []Endpoint, holds func(i int) bool) (int, string) {
	if bound == "" {
		return -1, ""
	}
	for i := range eps {
		if eps[i].ID != bound {
			continue
		}
		switch {
		case eps[i].Saturated && !allSaturated(eps):
			return -1, RebindSaturated
		case holds != nil && !holds(i):
			return -1, RebindEvicted
		}
		return i, ""
	}
	return -1, RebindGone
}
