// Package tenancy owns who may use warmpath and how much: tenants, their
// API keys and JWTs, the Principal every authenticated request carries,
// per-tenant and per-key limits, usage accounting, and the admin API over
// all of it. It does not own the fair queue (package tenancy/fairq) or the
// gateway's wiring.
//
// # Credentials
//
// An API key looks like wp-<id>-<secret>: 16 hex digits of visible id and 64
// of secret (256 bits). Only the secret's SHA-256 is stored, and it is
// compared in constant time. A key that is not of that form (such as
// WARMPATH_DEV_KEY, "sk-compose-dev") can be imported; it is found by the
// SHA-256 of the whole key. A JWT (HS256, RS256 or ES256) is verified
// against keys from the configuration or a JWKS file; each key is pinned to
// one algorithm, so "none" and HS/RS confusion fail; iss, aud and exp are
// required (with leeway); a configurable claim names the tenant, and
// optional claims lower the class ceiling and limits, never raise them.
// Authenticator reads "Authorization: Bearer <token>" or "x-api-key".
//
// Every bad credential (malformed, unknown, revoked or expired key; bad
// signature, wrong or "none" algorithm, expired token, wrong issuer or
// audience) gets the same 401 invalid_api_key body. A request without any
// credential gets 401 invalid_api_key too, with a message saying so.
//
// # Caching and revocation
//
// Key and tenant records are cached in process for CacheTTL (default 10s).
// Every change (revoke, rotate, tenant update) is published on
// <prefix>auth:invalidate; every Store.Run drops the entry on receipt, and
// drops its whole cache on every (re)subscription, since messages sent while
// disconnected are lost. So a revocation takes effect on every gateway
// within the pub/sub latency (well under a second) while pub/sub is up, and
// within CacheTTL in any case. Expiry is checked locally on every request.
// A verified JWT is remembered by its SHA-256 for at most CacheTTL and never
// past its exp, so a key removed from the JWKS stops verifying within
// JWKSPoll (the reload forgets every remembered token).
//
// # Redis unreachable
//
//	authentication, key or tenant cached   serves from cache for up to
//	                                       CacheTTL+CacheStale (default 10m10s)
//	authentication, not cached             fails closed: 503 service_unavailable,
//	                                       not 401, because the key may be valid
//	                                       and clients retry a 503 but give up
//	                                       on a 401 (malformed tokens still 401)
//	rate limits (requests, tokens/min)     redis_failure.rate_limits, default open
//	concurrency                            redis_failure.concurrency, default open
//	usage                                  kept in memory, retried next flush
//
// # Limits
//
// Requests per minute use go-redis/redis_rate (GCRA). Tokens per minute and
// concurrency use this package's admission script (admit.lua), one round
// trip for both scopes, all or nothing: tokens are a GCRA that may go into
// debt, so the estimate charged at admission can be corrected to the
// upstream's usage when the request ends (redis_rate can neither charge past
// its burst nor refund below "now"); concurrency slots are leases in a
// sorted set scored by expiry, renewed by Limiter.Run every LeaseTTL/3, so a
// crashed gateway's slots come back within LeaseTTL (default 30s). A limit
// reached is a 429 rate_limit_exceeded (type "requests" or "tokens", as
// OpenAI's are) with Retry-After, retry-after-ms and x-ratelimit-* headers.
//
// # Redis keys
//
// With the configured prefix P (e.g. "wp:"):
//
//	P tenants                       set of tenant ids
//	P tenant:<id>                   tenant record (JSON)
//	P tenant:<id>:keys              set of the tenant's key ids
//	P key:<id>                      hash: rec (key record, JSON), used (last use, Unix ms)
//	P keyhash:<sha256>              key id of an imported (non wp-) key
//	P auth:invalidate               pub/sub channel of cache invalidations
//	P rl:{<tenant>}:tok[:<key>]     tokens-per-minute GCRA state (tenant or key scope)
//	P rl:{<tenant>}:conc[:<key>]    concurrency leases (sorted set)
//	rate:P rl:{<tenant>}:req[:<key>]  requests-per-minute state; redis_rate
//	                                prepends "rate:" outside our prefix
//	P usage:{<tenant>}:<yyyymmdd>   hash of per-minute usage of one UTC day,
//	P usage:{<tenant>}:k:<key>:<yyyymmdd>  fields "<minute>:<r|p|c|o>"; kept Usage.Retention+1d
//
// Every limit and usage key of a tenant carries the hash tag {<tenant>}, so
// a Cluster keeps a tenant's admission in one slot; <key> is the key id or
// "jwt:<subject>". Token state expires a second after its bucket drains,
// leases twice LeaseTTL after their last renewal.
//
// # Redis Cluster
//
// Every operation works on a single server, Sentinel and Cluster. The
// admission, release and renewal scripts name only one principal's limit
// keys, which share the {<tenant>} tag. The records (tenants, tenant:<id>,
// key:<id>, keyhash:<sha256>) carry no tag and are never written in one
// transaction: a bearer token names only a key id or the key itself, so
// key:<id> and keyhash:<sha256> must be found without knowing the tenant.
// A key is written record first, then the imported key's hash (SETNX, so
// concurrent imports agree on one key), then the tenant's key index; a
// tenant record before the tenant index. An index entry thus always names
// an existing record, and a write that fails part way leaves at most a
// record nothing finds. Edits (revocation, rotation, tenant updates) are
// optimistic transactions on one record each. Pipelines (last-used and
// usage writes, lease renewal) are not transactions; a Cluster client
// splits them by slot. Invalidations are published cluster-wide, so a
// subscriber on any node receives them. A key_prefix containing '{' moves
// the hash tag into the prefix: "{wp}:" puts every key in one slot, which
// works; a prefix with an empty "{}" would split a tenant's limit keys
// across slots, which breaks admission.
//
// # Goroutines
//
// The package starts none by itself. Three components have a blocking Run
// the gateway must start: Store.Run (invalidation subscriber, last-used
// writes at most once a minute per key per gateway), Limiter.Run (lease
// renewal), Usage.Run (usage flush every FlushInterval and label
// recomputation); JWTVerifier.Run polls the JWKS file. Each returns when
// its context ends.
package tenancy
