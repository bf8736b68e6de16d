package gateway

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway/fleet"
)

// Check fills c's defaults and validates it as New would, offline: it binds
// no port and dials nothing (`warmpath config check` runs it). The error
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
	if !c.Embedded() && errs[0] == nil {
		errs = append(errs, checkFleet(c))
	}
	return errors.Join(errs...)
}

// checkFleet runs the fleet's own validation of the replica and discovery
// specs (base URLs without /v1, ZMQ endpoints that can be dialled, replay
// ports clear of the data-parallel KV ports). fleet.New starts nothing.
//
// TODO(lead): New builds the same specs; share one helper when the
// routing-core refactor lands.
func checkFleet(c Config) error {
	var fc fleet.Config
	for _, r := range c.Replicas {
		fc.Static = append(fc.Static, fleet.ReplicaSpec{Name: r.Name, URL: r.URL, Model: r.Model, KVEndpoint: r.KVEvents, ReplayEndpoint: r.KVReplay})
	}
	for _, d := range c.Discovery {
		fc.DNS = append(fc.DNS, fleet.DNSSpec{Name: d.DNS, Port: d.Port, Scheme: d.Scheme, KVPort: d.KVPort, ReplayPort: d.ReplayPort, Model: d.Model, Interval: d.Interval})
	}
	if _, err := fleet.New(fc); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}
