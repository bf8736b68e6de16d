package tenancy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// KeySpec is what an issued key may carry besides its tenant.
type KeySpec struct {
	// Name is a free-form label.
	Name string `json:"name,omitempty"`
	// Expires is when the key stops working; zero never.
	Expires time.Time `json:"expires,omitzero"`
	// Models narrows the tenant's allow-list; nil keeps it.
	Models []string `json:"models"`
	// Limits are the key's own limits, enforced besides the tenant's.
	Limits Limits `json:"limits"`
	// ClassCeiling lowers the tenant's class ceiling; "" keeps it.
	ClassCeiling string `json:"class_ceiling,omitempty"`
}

func (sp KeySpec) validate(now time.Time) error {
	if len(sp.Name) > 128 {
		return invalid("name", "at most 128 bytes")
	}
	if !sp.Expires.IsZero() && !sp.Expires.After(now) {
		return invalid("expires", "must be in the future")
	}
	if err := validModels(sp.Models); err != nil {
		return invalidFrom(err)
	}
	if sp.ClassCeiling != "" && !validClass(sp.ClassCeiling) {
		return invalid("class_ceiling", "must be %q or %q", ClassInteractive, ClassBackground)
	}
	if err := sp.Limits.validate("limits"); err != nil {
		return invalidFrom(err)
	}
	return nil
}

// IssueKey creates a wp- key for tenant and returns its record and the full
// key, which is never stored and cannot be shown again.
func (s *Store) IssueKey(ctx context.Context, tenant string, sp KeySpec) (Key, string, error) {
	id, secret, full := newKeyMaterial()
	k, err := s.putKey(ctx, tenant, id, hashSecret(secret), false, sp)
	if err != nil {
		return Key{}, "", err
	}
	return k, full, nil
}

// ImportKey stores an existing key that is not of the wp- form (such as
// WARMPATH_DEV_KEY) for tenant. Such a key has no visible id: it is found by
// the SHA-256 of the whole key, under <prefix>keyhash:<hash>. Importing a
// key already imported for the same tenant returns its record; for another
// tenant, ErrExists.
func (s *Store) ImportKey(ctx context.Context, tenant, plaintext string, sp KeySpec) (Key, error) {
	if cleanToken(plaintext) != plaintext || len(plaintext) < 8 {
		return Key{}, invalid("key", "must be 8 or more printable characters without spaces")
	}
	if strings.HasPrefix(plaintext, keyPrefix) || looksLikeJWT(plaintext) {
		return Key{}, invalid("key", "a wp- key or a JWT cannot be imported")
	}
	h := hashSecret(plaintext)
	if id, err := s.rdb.Get(ctx, s.hashKey(h)).Result(); err == nil {
		return s.imported(ctx, tenant, id)
	} else if !errors.Is(err, redis.Nil) {
		return Key{}, fmt.Errorf("tenancy: import key: %w", err)
	}
	id, _, _ := newKeyMaterial()
	return s.putKey(ctx, tenant, id, h, true, sp)
}

// imported returns the key whose id an imported key's hash names, if it is
// tenant's, and indexes it under the tenant again (an import that failed
// after claiming the hash left it unlisted); ErrExists if it is another
// tenant's.
func (s *Store) imported(ctx context.Context, tenant, id string) (Key, error) {
	k, err := s.readKey(ctx, id)
	if err != nil {
		return Key{}, err
	}
	if k.Tenant != tenant {
		return Key{}, ErrExists
	}
	if err := s.rdb.SAdd(ctx, s.tenantKeysKey(tenant), id).Err(); err != nil {
		return Key{}, fmt.Errorf("tenancy: index key: %w", err)
	}
	return k.public(), nil
}

// putKey stores a new key: its record, then (imported) the hash naming
// it, then its id in the tenant's index. The three live in different
// Cluster slots and cannot share a hash tag, since a bearer token names
// only the key id (key:<id>) or the key itself (keyhash:<sha256>), not the
// tenant; so they are written one by one, in an order where every index
// entry names a record that exists. A failure part way leaves at most a
// record nothing finds (an issued key's secret was never shown) or an
// imported key missing from the listing, which importing it again repairs.
// ListKeys skips ids whose record is missing all the same.
func (s *Store) putKey(ctx context.Context, tenant, id, hash string, imported bool, sp KeySpec) (Key, error) {
	now := s.now().UTC().Truncate(time.Millisecond)
	if err := sp.validate(now); err != nil {
		return Key{}, err
	}
	if _, err := s.GetTenant(ctx, tenant); err != nil {
		return Key{}, err
	}
	k := Key{ID: id, Tenant: tenant, Name: sp.Name, Hash: hash, Imported: imported, Created: now,
		Expires: sp.Expires.UTC(), Models: sp.Models, Limits: sp.Limits, ClassCeiling: sp.ClassCeiling}
	b, _ := json.Marshal(k)
	if err := s.rdb.HSet(ctx, s.keyKey(id), "rec", b).Err(); err != nil {
		return Key{}, fmt.Errorf("tenancy: store key: %w", err)
	}
	if imported {
		won, err := s.rdb.SetNX(ctx, s.hashKey(hash), id, 0).Result()
		if err != nil {
			return Key{}, fmt.Errorf("tenancy: store key hash: %w", err)
		}
		if !won { // a concurrent import of the same key claimed the hash first
			_ = s.rdb.Del(ctx, s.keyKey(id)).Err() // never indexed nor named by the hash
			first, err := s.rdb.Get(ctx, s.hashKey(hash)).Result()
			if err != nil {
				return Key{}, fmt.Errorf("tenancy: read key hash: %w", err)
			}
			return s.imported(ctx, tenant, first)
		}
	}
	if err := s.rdb.SAdd(ctx, s.tenantKeysKey(tenant), id).Err(); err != nil {
		return Key{}, fmt.Errorf("tenancy: index key: %w", err)
	}
	return k.public(), nil
}

// ListKeys returns tenant's keys (without hashes), oldest first.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]Key, error) {
	if _, err := s.GetTenant(ctx, tenant); err != nil {
		return nil, err
	}
	ids, err := s.rdb.SMembers(ctx, s.tenantKeysKey(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("tenancy: list keys: %w", err)
	}
	var out []Key
	for _, id := range ids {
		k, err := s.readKey(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if k.Tenant == tenant {
			out = append(out, k.public())
		}
	}
	slices.SortFunc(out, func(a, b Key) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID)) })
	return out, nil
}

// GetKey returns one of tenant's keys; ErrNotFound also when the key
// belongs to another tenant.
func (s *Store) GetKey(ctx context.Context, tenant, id string) (Key, error) {
	if len(id) != keyIDLen || !isLowerHex(id) {
		return Key{}, ErrNotFound
	}
	k, err := s.readKey(ctx, id)
	if err != nil {
		return Key{}, err
	}
	if k.Tenant != tenant {
		return Key{}, ErrNotFound
	}
	return k.public(), nil
}

// RevokeKey revokes one of tenant's keys now, on every gateway within the
// documented bound. Revoking a revoked key is a no-op.
func (s *Store) RevokeKey(ctx context.Context, tenant, id string) (Key, error) {
	return s.editKey(ctx, tenant, id, func(k *Key, now time.Time) error {
		if k.Revoked.IsZero() {
			k.Revoked = now
		}
		return nil
	})
}

// RotateKey issues a successor of one of tenant's active keys, with the
// same name, expiry, models, limits and ceiling, and lets the old key work
// for grace more (0: revoke it now). It returns the new record and full key.
func (s *Store) RotateKey(ctx context.Context, tenant, id string, grace time.Duration) (Key, string, error) {
	if grace < 0 {
		return Key{}, "", invalid("grace", "must not be negative")
	}
	old, err := s.GetKey(ctx, tenant, id)
	if err != nil {
		return Key{}, "", err
	}
	if !old.active(s.now()) || old.RotatedTo != "" {
		return Key{}, "", invalid("key", "only an active key that was not rotated yet can be rotated")
	}
	sp := KeySpec{Name: old.Name, Models: old.Models, Limits: old.Limits, ClassCeiling: old.ClassCeiling}
	if !old.Expires.IsZero() && old.Expires.After(s.now()) {
		sp.Expires = old.Expires
	}
	nk, full, err := s.IssueKey(ctx, tenant, sp)
	if err != nil {
		return Key{}, "", err
	}
	_, err = s.editKey(ctx, tenant, id, func(k *Key, now time.Time) error {
		if k.RotatedTo != "" {
			return invalid("key", "rotated concurrently")
		}
		k.RotatedTo = nk.ID
		if end := now.Add(grace); k.Expires.IsZero() || end.Before(k.Expires) {
			k.Expires = end
		}
		return nil
	})
	if err != nil {
		_, _ = s.RevokeKey(ctx, tenant, nk.ID) // do not leave a second live key behind
		return Key{}, "", err
	}
	return nk, full, nil
}

// editKey applies edit to one of tenant's keys under optimistic locking and
// invalidates it everywhere. A last-used write to the key that lands
// inside the transaction makes it try again (watch), so a key in use can
// be revoked.
func (s *Store) editKey(ctx context.Context, tenant, id string, edit func(*Key, time.Time) error) (Key, error) {
	if len(id) != keyIDLen || !isLowerHex(id) {
		return Key{}, ErrNotFound
	}
	var out Key
	err := s.watch(ctx, func(tx *redis.Tx) error {
		k, err := s.readKey(ctx, id)
		if err != nil {
			return err
		}
		if k.Tenant != tenant {
			return ErrNotFound
		}
		if err := edit(k, s.now().UTC().Truncate(time.Millisecond)); err != nil {
			return err
		}
		used := k.LastUsed
		k.LastUsed = time.Time{} // kept in its own field
		b, _ := json.Marshal(k)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, s.keyKey(id), "rec", b)
			return nil
		})
		k.LastUsed = used
		out = k.public()
		return err
	}, s.keyKey(id))
	if err != nil {
		return Key{}, retryable(err)
	}
	names := []string{"k:" + id}
	if out.Imported {
		names = append(names, "h:"+s.hashOf(ctx, id))
	}
	s.invalidate(ctx, names...)
	return out, nil
}

// hashOf returns the stored hash of key id ("" when unreadable).
func (s *Store) hashOf(ctx context.Context, id string) string {
	k, err := s.readKey(ctx, id)
	if err != nil {
		return ""
	}
	return k.Hash
}
