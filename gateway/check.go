package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/redis/go-redis/v9"
)

// Check fills c's defaults and validates it as New would, offline: it binds
// no port and dials nothing (`warmpath config check` runs it). The fleet's
// own checks (base URLs without /v1, ZMQ endpoints that can be dialled,
// replay ports clear of the data-parallel KV ports) run inside validate,
// the authentication's in checkAuth, both as in New. The error
// joins one error per problem found, each naming its field; unwrap it with
// interface{ Unwrap() []error } to list them. A configuration naming no
// fleet is valid: serve then starts the embedded simulated fleet.
func (c Config) Check() error {
	c = c.withDefaults()
	errs := []error{c.validate()}
	// validate checks the scheme; go-redis checks the rest (db number,
	// options) when it dials, which Check does not.
	if u, err := url.Parse(c.Redis.URL); err == nil && (u.Scheme == "redis" || u.Scheme == "rediss") {
		if _, err := redis.ParseURL(c.Redis.URL); err != nil {
			errs = append(errs, fmt.Errorf("config: redis.url: %w", err))
		}
	}
	c.devAuth(slog.New(slog.DiscardHandler))
	if _, err := c.checkAuth(slog.New(slog.DiscardHandler)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
