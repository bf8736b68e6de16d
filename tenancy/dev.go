package tenancy

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// DevTenant is the tenant of the embedded development setup.
const DevTenant = "dev"

// EnsureDev makes sure the dev tenant exists (shared, no limits) and returns
// a key for it to print. A non-empty devKey (WARMPATH_DEV_KEY, e.g.
// "sk-compose-dev") is imported as the dev tenant's key, found by the
// SHA-256 of the whole key, and keeps working across restarts on the same
// Redis; importing it again is a no-op. An empty devKey issues a fresh wp-
// key at every call.
func EnsureDev(ctx context.Context, st *Store, devKey string) (string, error) {
	_, err := st.CreateTenant(ctx, Tenant{ID: DevTenant, Name: DevTenant})
	if err != nil && !errors.Is(err, ErrExists) {
		return "", fmt.Errorf("tenancy: dev tenant: %w", err)
	}
	if devKey == "" {
		_, full, err := st.IssueKey(ctx, DevTenant, KeySpec{Name: "dev"})
		if err != nil {
			return "", fmt.Errorf("tenancy: dev key: %w", err)
		}
		return full, nil
	}
	if strings.HasPrefix(devKey, keyPrefix) {
		return "", errors.New("tenancy: a dev key of the wp- form cannot be imported; issue one through the admin API instead")
	}
	k, err := st.ImportKey(ctx, DevTenant, devKey, KeySpec{Name: "dev"})
	if err != nil {
		return "", fmt.Errorf("tenancy: import dev key: %w", err)
	}
	if !k.active(st.now()) {
		return "", fmt.Errorf("tenancy: the dev key (key %s) was revoked or has expired; set another WARMPATH_DEV_KEY", k.ID)
	}
	return devKey, nil
}
