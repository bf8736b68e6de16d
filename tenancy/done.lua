-- End of a request: free its concurrency slots and correct its token charge
-- by the difference between actual and estimated tokens (a refund when
-- negative, a charge that may go into debt when positive).
--
-- KEYS[1], KEYS[2]: tenant tokens, tenant leases
-- KEYS[3], KEYS[4]: key tokens, key leases
-- ARGV: lease id, token delta, tenant tpm, key tpm (0 = none)
local t = redis.call("TIME")
local now = t[1] * 1000 + t[2] / 1000
local lease, delta = ARGV[1], tonumber(ARGV[2])

redis.call("ZREM", KEYS[2], lease)
redis.call("ZREM", KEYS[4], lease)

local function correct(key, limit)
  if limit <= 0 or delta == 0 then return end
  local cur = tonumber(redis.call("GET", key) or now)
  local new
  if delta > 0 then
    new = math.max(cur, now) + delta * 60000 / limit
  else
    new = cur + delta * 60000 / limit
  end
  if new <= now then
    redis.call("DEL", key)
  else
    redis.call("SET", key, string.format("%.3f", new), "PX", math.ceil(new - now) + 1000)
  end
end
correct(KEYS[1], tonumber(ARGV[3]))
correct(KEYS[3], tonumber(ARGV[4]))
return 1
