-- Admission for one request: tokens-per-minute (GCRA that may go into debt)
-- and concurrency (a sorted set of leases scored by expiry) for up to two
-- scopes, the tenant's and the key's. All or nothing: nothing is charged
-- unless every limit admits.
--
-- KEYS[1], KEYS[2]: tenant tokens, tenant leases
-- KEYS[3], KEYS[4]: key tokens, key leases
-- ARGV: lease id, lease ttl (ms), estimated tokens,
--       tenant tpm, tenant concurrency, key tpm, key concurrency (0 = none)
-- Returns {admitted, reason, retry_ms,
--          tok_remaining_t, tok_reset_ms_t, tok_remaining_k, tok_reset_ms_k}
-- where reason is "" or "tokens" or "concurrency".
local t = redis.call("TIME")
local now = t[1] * 1000 + t[2] / 1000
local lease, ttl, est = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function tokens(key, limit)
  if limit <= 0 then return true, 0, -1, 0 end
  local ei = 60000 / limit            -- ms per token
  local tau = 60000                   -- the bucket holds one minute of tokens
  local tat = math.max(tonumber(redis.call("GET", key) or now), now)
  local new = tat + est * ei
  if new - now > tau and tat > now then
    local retry = math.min(new - now - tau, tat - now)
    return false, math.ceil(retry), 0, 0
  end
  local remaining = math.max(math.floor((tau - (new - now)) / ei), 0)
  return true, new, remaining, math.ceil(new - now)
end

local function slots(key, limit)
  if limit <= 0 then return true, 0 end
  redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
  if redis.call("ZCARD", key) >= limit then
    local first = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
    return false, math.ceil(tonumber(first[2]) - now)
  end
  return true, 0
end

local okT, newT, remT, resetT = tokens(KEYS[1], tonumber(ARGV[4]))
if not okT then return {0, "tokens", newT, 0, 0, 0, 0} end
local okK, newK, remK, resetK = tokens(KEYS[3], tonumber(ARGV[6]))
if not okK then return {0, "tokens", newK, 0, 0, 0, 0} end
for i, k in ipairs({{KEYS[2], ARGV[5]}, {KEYS[4], ARGV[7]}}) do
  local ok, retry = slots(k[1], tonumber(k[2]))
  if not ok then return {0, "concurrency", retry, 0, 0, 0, 0} end
end

if tonumber(ARGV[4]) > 0 then
  redis.call("SET", KEYS[1], string.format("%.3f", newT), "PX", resetT + 1000)
end
if tonumber(ARGV[6]) > 0 then
  redis.call("SET", KEYS[3], string.format("%.3f", newK), "PX", resetK + 1000)
end
for i, k in ipairs({{KEYS[2], ARGV[5]}, {KEYS[4], ARGV[7]}}) do
  if tonumber(k[2]) > 0 then
    redis.call("ZADD", k[1], now + ttl, lease)
    redis.call("PEXPIRE", k[1], 2 * ttl)
  end
end
return {1, "", 0, remT, resetT, remK, resetK}
