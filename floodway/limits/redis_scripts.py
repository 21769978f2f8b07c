"""The Redis backend's primitives as Lua, one script per primitive.

Conventions shared by every script:

* time is the Redis server's ``TIME`` in milliseconds, so the hosts' clocks never matter
  (Redis >= 5 replicates scripts by effect, so reading ``TIME`` before a write is allowed);
* numbers go out as strings formatted ``%.17g``: Redis would truncate a Lua number reply to an
  integer, and ``tostring`` keeps only 14 digits, too few for a millisecond timestamp;
* a bucket is a HASH ``{l: level, t: ms}`` that expires once it would be full again (a missing
  bucket reads as full, so expiry loses nothing); slots are a ZSET ``slot id -> expiry ms``
  purged on touch; a gate is a plain key whose PTTL is the pause; a resource's estimates are a
  HASH of named numbers (``<field>:t`` in ms), its meter four of them (``sent``, ``throttled``,
  and their slow window's) that decay by e^(-elapsed / tau) from ``meter:t``;
* the state's generation (epoch) is a plain key, the server's time (ms, to the µs) when the
  state was created, never expiring: when Redis restarts without persistence it is gone, and
  the next script to look creates a new one. A caller that knew an older generation learns
  that the state was lost, and the recovery gate stays closed until ``epoch + recovery_ms``:
  admissions wait while the holders of lost slots take them again (``RENEW_SLOT``).
"""

from __future__ import annotations

from floodway.limits.backend import MAX_DOUBLINGS, METER_FIELDS, SLOW_OF


def _lua(value: object) -> str:
    """A Lua literal of a str, a number, or a tuple or dict of them."""
    if isinstance(value, tuple):
        return "{" + ", ".join(_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in value.items()) + "}"
    return repr(value)


_PRELUDE = (
    # The meter's fields with their time constants (in taus), and each one's slow window.
    f"\nlocal METER = {_lua(METER_FIELDS)}\n"
    f"local SLOW_OF = {_lua(SLOW_OF)}\n"
    + """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

local function fmt(x)
  return string.format('%.17g', x)
end

local function refilled(key, cap, rate, now)
  local v = redis.call('HMGET', key, 'l', 't')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  if level == nil or ts == nil then
    return cap
  end
  if now > ts then
    level = level + (now - ts) / 1000 * rate
  end
  if level > cap then
    level = cap
  end
  return level
end

-- The current generation; closes the recovery gate when the caller knew an older one.
local function generation(ekey, gkey, known, recovery_ms, now)
  local e = tonumber(redis.call('GET', ekey))
  if not e then
    e = now  -- to the microsecond: a loss within the same millisecond is still a new generation
    redis.call('SET', ekey, fmt(e))
  end
  local left = e + recovery_ms - now
  if known > 0 and known ~= e and left > 0 then
    redis.call('SET', gkey, '1', 'PX', math.ceil(left))
  end
  return e
end

-- The meter's counts decayed to now (not written), by field.
local function decayed(key, tau, now)
  local names = {}
  for i, field in ipairs(METER) do names[i] = field[1] end
  local v = redis.call('HMGET', key, 'meter:t', unpack(names))
  local t = tonumber(v[1]) or now
  local counts = {}
  for i, field in ipairs(METER) do
    local keep = 1
    if now > t then keep = math.exp(-(now - t) / (field[2] * tau)) end
    counts[field[1]] = (tonumber(v[i + 1]) or 0) * keep
  end
  return counts
end

local function count(key, field, tau, now)
  local counts = decayed(key, tau, now)
  counts[field] = counts[field] + 1
  counts[SLOW_OF[field]] = counts[SLOW_OF[field]] + 1
  local args = {'meter:t', fmt(now)}
  for name, n in pairs(counts) do
    args[#args + 1] = name
    args[#args + 1] = fmt(n)
  end
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, 86400000)
end

local function store(key, level, cap, rate, now)
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(now))
  local ttl = 86400000
  if rate > 0 then
    ttl = math.ceil((cap - level) / rate * 1000) + 1000
  end
  redis.call('PEXPIRE', key, ttl)
end
"""
)

# KEYS: epoch, then gates.. (the recovery gate first), slot sets.., buckets.., [meter]
# ARGV: known epoch (0 = none), recovery_ms, n_gates, n_slots, n_buckets, meter tau_ms (0 = no
#       meter), then (limit, slot_id, ttl_ms, replaced slot_id or '') per slot, then (capacity,
#       refill_per_s, cost, lag_s) per bucket. A claim that replaces a live slot takes it over: it
#       does not count against the limit.
# Returns {granted, now_ms, wait_ms ('-1' = only a release helps / never), epoch, n_refused,
#          refused key indexes (1-based, the epoch not counted).., held key indexes..}; when
#          granted, {1, now_ms, '0', epoch, 0, slots in use per slot set..}
ACQUIRE = (
    _PRELUDE
    + """
local ng, ns, nb = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local epoch = generation(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), now)
local refused, held = {}, {}
local wait = 0
local tau = tonumber(ARGV[6])
local a = 7
local K = {}  -- the keys after the epoch
for i = 2, #KEYS do K[i - 1] = KEYS[i] end

for i = 1, ng do
  local left = redis.call('PTTL', K[i])
  if left > 0 then
    refused[#refused + 1] = i
    if wait >= 0 and left > wait then wait = left end
  end
end

local claims = {}
for j = 1, ns do
  local i = ng + j
  local limit, id, ttl, prev = tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  a = a + 4
  redis.call('ZREMRANGEBYSCORE', K[i], '-inf', now)
  local mine = redis.call('ZSCORE', K[i], id)
  if mine then held[#held + 1] = i end
  local inherits = prev ~= '' and redis.call('ZSCORE', K[i], prev)
  if mine or (not inherits and redis.call('ZCARD', K[i]) >= limit) then
    refused[#refused + 1] = i
    wait = -1
  end
  claims[j] = {K[i], id, ttl, inherits and prev or ''}
end

local debits = {}
for j = 1, nb do
  local i = ng + ns + j
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local lag = tonumber(ARGV[a + 3])
  a = a + 4
  local level = refilled(K[i], cap, rate, now)
  if level < cost then
    refused[#refused + 1] = i
    if cost > cap or rate <= 0 then
      wait = -1
    elseif wait >= 0 then
      local w = (cost - level) / rate * 1000
      if w > wait then wait = w end
    end
  end
  -- Debit.level_after: a full bucket's refill starts lag seconds after the take
  debits[j] = {K[i], math.min(level, cap - lag * rate) - cost, cap, rate}
end

if #refused > 0 then
  local out = {0, fmt(now), fmt(wait), fmt(epoch), #refused}
  for _, i in ipairs(refused) do out[#out + 1] = i end
  for _, i in ipairs(held) do out[#out + 1] = i end
  return out
end

local out = {1, fmt(now), '0', fmt(epoch), 0}
for _, c in ipairs(claims) do
  if c[4] ~= '' then redis.call('ZREM', c[1], c[4]) end
  redis.call('ZADD', c[1], fmt(now + c[3]), c[2])
  if redis.call('PTTL', c[1]) < c[3] then redis.call('PEXPIRE', c[1], math.ceil(c[3])) end
  out[#out + 1] = redis.call('ZCARD', c[1])
end
for _, d in ipairs(debits) do
  store(d[1], d[2], d[3], d[4], now)
end
if tau > 0 then count(K[ng + ns + nb + 1], 'sent', tau, now) end
return out
"""
)

# KEYS: bucket. ARGV: capacity, refill_per_s, delta. Returns the new level.
SETTLE = (
    _PRELUDE
    + """
local cap, rate, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local level = refilled(KEYS[1], cap, rate, now) - delta
if level > cap then level = cap end
store(KEYS[1], level, cap, rate, now)
return fmt(level)
"""
)

# KEYS: bucket. ARGV: capacity, refill_per_s, ceiling. Returns the new level.
CLAMP = (
    _PRELUDE
    + """
local cap, rate, ceiling = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local level = refilled(KEYS[1], cap, rate, now)
if level > ceiling then level = ceiling end
store(KEYS[1], level, cap, rate, now)
return fmt(level)
"""
)

# KEYS: bucket. ARGV: capacity, refill_per_s. Read only.
LEVEL = (
    _PRELUDE
    + """
return fmt(refilled(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms()))
"""
)

# KEYS: slot set, epoch, recovery gate.
# ARGV: slot_id, ttl_ms, known epoch, epoch the slot was taken in (0 = unknown), recovery_ms.
# Returns {1 if held now / 0 if no longer held, epoch}. A slot lost with the state (taken in
# an older generation) is taken again even over the limit: its call is running.
RENEW_SLOT = (
    _PRELUDE
    + """
local now = now_ms()
local ttl = tonumber(ARGV[2])
local epoch = generation(KEYS[2], KEYS[3], tonumber(ARGV[3]), tonumber(ARGV[5]), now)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not expiry then
  local taken = tonumber(ARGV[4])
  if taken == 0 or taken == epoch then return {0, fmt(epoch)} end
  redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[1])
elseif now + ttl > expiry then
  redis.call('ZADD', KEYS[1], 'XX', fmt(now + ttl), ARGV[1])
end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], math.ceil(ttl)) end
return {1, fmt(epoch)}
"""
)

# KEYS: slot set. ARGV: slot_id, ttl_ms. Takes the slot until now + ttl (or keeps a later
# expiry), over the limit if need be.
HOLD_SLOT = (
    _PRELUDE
    + """
local ttl = tonumber(ARGV[2])
local expiry = now_ms() + ttl
local current = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not current or current < expiry then
  redis.call('ZADD', KEYS[1], fmt(expiry), ARGV[1])
end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], math.ceil(ttl)) end
return 1
"""
)

# KEYS: slot set. Returns the slots whose expiry is still ahead.
SLOTS_IN_USE = (
    _PRELUDE
    + """
return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(now_ms()), '+inf')
"""
)

# KEYS: estimates. ARGV: meter tau_ms (0 = leave the meter as stored).
# Returns a flat list {field, value, ...}, meter counts decayed to now.
ESTIMATES = (
    _PRELUDE
    + """
local flat = redis.call('HGETALL', KEYS[1])
local tau = tonumber(ARGV[1])
if tau > 0 then
  local counts = decayed(KEYS[1], tau, now_ms())
  for i = 1, #flat, 2 do
    if counts[flat[i]] ~= nil then flat[i + 1] = fmt(counts[flat[i]]) end
  end
end
return flat
"""
)

# KEYS: estimates. ARGV: field, value, floor, granted_at_ms. Returns the estimate.
CUT = (
    _PRELUDE
    + """
local f = ARGV[1]
local now = now_ms()
local v = redis.call('HMGET', KEYS[1], f, f .. ':t', f .. ':n')
local current, t, n = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]) or 0
if current and t and t > tonumber(ARGV[4]) then return fmt(current) end
local value = tonumber(ARGV[2])
if current and current < value then value = current end
if value < tonumber(ARGV[3]) then value = tonumber(ARGV[3]) end
redis.call('HSET', KEYS[1], f, fmt(value), f .. ':b', fmt(value), f .. ':t', fmt(now),
           f .. ':c', fmt(now / 1000), f .. ':n', fmt(n + 1), f .. ':k', '0')
redis.call('PEXPIRE', KEYS[1], 86400000)
return fmt(value)
"""
)

# KEYS: estimates. ARGV: field, start, step, cap, interval_ms, quiet_ms. Returns the estimate.
GROW = (
    _PRELUDE
    + """
local f = ARGV[1]
local now = now_ms()
local v = redis.call('HMGET', KEYS[1], f, f .. ':t', f .. ':c', f .. ':k')
local current = tonumber(v[1]) or tonumber(ARGV[2])
local t, cut, k = tonumber(v[2]), tonumber(v[3]), tonumber(v[4]) or 0
if t and now - t < tonumber(ARGV[5]) then return fmt(current) end
local step = tonumber(ARGV[3])
if cut then
  if now - cut * 1000 < tonumber(ARGV[6]) then return fmt(current) end
  step = step * 2 ^ math.min(k, """
    + str(MAX_DOUBLINGS)
    + """)
  redis.call('HSET', KEYS[1], f .. ':k', fmt(k + 1))
end
local grown, cap = current + step, tonumber(ARGV[4])
redis.call('HSET', KEYS[1], f .. ':t', fmt(now))
if grown >= cap then
  redis.call('HDEL', KEYS[1], f)
  return fmt(cap)
end
redis.call('HSET', KEYS[1], f, fmt(grown))
redis.call('PEXPIRE', KEYS[1], 86400000)
return fmt(grown)
"""
)

# KEYS: estimates. ARGV: field (sent | throttled), tau_ms.
TICK = (
    _PRELUDE
    + """
count(KEYS[1], ARGV[1], tonumber(ARGV[2]), now_ms())
return 1
"""
)

# KEYS: gate. ARGV: pause_ms. Returns the ms this call added.
PAUSE = """
local ms = math.ceil(tonumber(ARGV[1]))
local left = redis.call('PTTL', KEYS[1])
if left < 0 then left = 0 end
if ms <= left then return '0' end
redis.call('SET', KEYS[1], '1', 'PX', ms)
return tostring(ms - left)
"""
