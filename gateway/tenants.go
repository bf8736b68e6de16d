package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/warmpath/warmpath/migrations"
	"github.com/warmpath/warmpath/tenancy"
)

// tenants is the gateway's tenancy: who a request is from (the
// authenticator in front of the API), what it may do (limits at
// admission), what it used (usage and per-tenant metrics labels), and the
// admin API. Nil pieces are off: mode none has no store, no limiter and no
// admin API.
type tenants struct {
	cfg    tenancy.Config
	store  *tenancy.Store
	jwt    *tenancy.JWTVerifier
	auth   *tenancy.Authenticator
	limit  *tenancy.Limiter
	usage  *tenancy.Usage
	labels *tenancy.Labeler
	admin  *tenancy.Admin
	devKey string
}

// devAuth fills the authentication of a development setup: a dev key (or
// the embedded fleet) means the keys mode, with a per-process salt secret
// when none is configured.
func (c *Config) devAuth(log *slog.Logger) {
	if c.Auth.Mode != "" || (c.DevKey == "" && !c.Embedded()) {
		return
	}
	c.Auth.Mode = tenancy.ModeKeys
	if c.Auth.SaltSecret == "" && c.Auth.SaltSecretFile == "" {
		var b [32]byte
		_, _ = rand.Read(b[:])
		c.Auth.SaltSecret = hex.EncodeToString(b[:])
		log.Info("auth: development setup: keys mode with a per-process salt secret (isolated tenants' caches go cold at restart)")
	}
}

// checkAuth validates the authentication configuration (reading its
// secret files) and refuses a production configuration that runs open.
func (c *Config) checkAuth(log *slog.Logger) (tenancy.Config, error) {
	ac, err := c.Auth.Validate()
	if err != nil {
		return ac, fmt.Errorf("config: %w", err)
	}
	if err := tenancy.CheckStartup(ac, !c.Embedded(), log); err != nil {
		return ac, fmt.Errorf("config: %w", err)
	}
	return ac, nil
}

// newTenants builds the tenancy components for cfg. The keys and jwt
// modes keep their records in Redis, so they need one.
func newTenants(cfg *Config, rdb redis.UniversalClient, log *slog.Logger) (*tenants, error) {
	ac, err := cfg.checkAuth(log)
	if err != nil {
		return nil, err
	}
	t := &tenants{cfg: ac, labels: tenancy.NewLabeler(ac.MetricsTopN), devKey: cfg.DevKey}
	log = log.With("component", "tenancy")
	if ac.Mode != tenancy.ModeNone {
		if rdb == nil {
			return nil, fmt.Errorf("config: auth.mode %s keeps tenants and keys in Redis: set redis", ac.Mode)
		}
		r := tenancy.Redis{Client: rdb, Prefix: cfg.Redis.KeyPrefix, Timeout: cfg.Redis.Timeout}
		t.store = tenancy.NewStore(r, ac, log)
		t.limit = tenancy.NewLimiter(r, ac, log)
		t.usage = tenancy.NewUsage(r, ac, t.labels, log)
		t.admin = tenancy.NewAdmin(ac, t.store, t.usage, log)
	}
	if ac.Mode == tenancy.ModeJWT || ac.Mode == tenancy.ModeKeysJWT {
		if t.jwt, err = tenancy.NewJWTVerifier(ac, nil, log); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if t.auth, err = tenancy.NewAuthenticator(ac, t.store, t.jwt, log); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return t, nil
}

// start prepares the keyspace and the dev tenant, then runs the
// components' loops under eg until ctx ends.
func (t *tenants) start(ctx context.Context, eg *errgroup.Group, rdb redis.UniversalClient, prefix string, log *slog.Logger) error {
	if rdb != nil {
		if err := migrate(ctx, rdb, prefix, log); err != nil {
			return err
		}
	}
	if t.store != nil && t.devKey != "" {
		if _, err := tenancy.EnsureDev(ctx, t.store, t.devKey); err != nil {
			return fmt.Errorf("gateway: dev tenant: %w", err)
		}
	}
	var runs []func(context.Context) error
	if t.store != nil {
		runs = append(runs, t.store.Run, t.limit.Run, t.usage.Run)
	}
	if t.jwt != nil {
		runs = append(runs, t.jwt.Run)
	}
	for _, run := range runs {
		eg.Go(func() error { return ignoreCanceled(run(ctx)) })
	}
	return nil
}

// migrate applies pending keyspace migrations under their lock (two
// gateways starting together apply each once) and refuses a keyspace that
// a newer warmpath migrated.
func migrate(ctx context.Context, rdb redis.UniversalClient, prefix string, log *slog.Logger) error {
	applied, err := migrations.Apply(ctx, rdb, prefix, migrations.Steps())
	if err != nil {
		return fmt.Errorf("gateway: redis keyspace: %w", err)
	}
	for _, s := range applied {
		log.Info("applied keyspace migration", "version", s.Version, "name", s.Name)
	}
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
