-- Admission, settlement and lease refresh for the gateway's limits, in one atomic call.
-- The same GCRA arithmetic as gateway/ratelimit/memory.py, on the Redis server's clock.
--
-- KEYS: every bucket the call touches (all share one hash tag, so one slot on a Cluster).
-- ARGV[1]: JSON {a: admissions, s: settlements, l: lease refreshes, x: lease seconds}
--   admission  {r: [[key index, kind, limit], ...], c: tokens, m: lease member}
--   settlement {r: [[key index, kind, limit], ...], d: token delta, m: lease member}
--   refresh    [key index, lease member]
--   kind: "r" requests, "t" tokens (GCRA buckets: a string TAT), "p" parallel (a sorted set
--   of lease members scored by expiry)
-- Returns JSON: per admission [admitted 0|1, [[remaining, reset s, retry s], ...per rule]].
-- An admission writes only if every one of its rules admits it.

local WINDOW = 60
local EPS = 1e-9
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local spec = cjson.decode(ARGV[1])
local lease = tonumber(spec.x)

local function store(key, tat)
  local ttl = math.ceil((tat - now) * 1000) + 1000
  redis.call('SET', key, string.format('%.6f', tat), 'PX', ttl)
end

local function hold(key, member)
  redis.call('ZADD', key, now + lease, member)
  redis.call('PEXPIRE', key, math.ceil(lease * 2000))
end

-- Settlements first: what they give back counts for the admissions of this same call.
for _, s in ipairs(spec.s) do
  for _, r in ipairs(s.r) do
    local key = KEYS[r[1]]
    if r[2] == 'p' then
      redis.call('ZREM', key, s.m)
    elseif r[2] == 't' and s.d ~= 0 then
      local tat = tonumber(redis.call('GET', key)) or now
      local base = tat
      if s.d > 0 and base < now then base = now end
      store(key, math.max(now, base + s.d * WINDOW / r[3]))
    end
  end
end

for _, f in ipairs(spec.l) do
  redis.call('ZADD', KEYS[f[1]], 'XX', now + lease, f[2])
  redis.call('PEXPIRE', KEYS[f[1]], math.ceil(lease * 2000))
end

local out = {}
for i, a in ipairs(spec.a) do
  local admitted = 1
  local states = {}
  local writes = {}
  for j, r in ipairs(a.r) do
    local key, kind, limit = KEYS[r[1]], r[2], r[3]
    if kind == 'p' then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      local used = redis.call('ZCARD', key)
      if used >= limit then
        admitted = 0
        states[j] = {0, 0, 1}
      else
        states[j] = {limit - used - 1, 0, 0}
        writes[#writes + 1] = {key, false}
      end
    else
      local cost = 1
      if kind == 't' then cost = a.c end
      local interval = WINDOW / limit
      local tat = tonumber(redis.call('GET', key)) or now
      local base = math.max(tat, now)
      local new = base + cost * interval
      local allow_at = new - WINDOW
      if allow_at > now + EPS then
        admitted = 0
        states[j] = {math.floor((now + WINDOW - base) / interval + EPS), base - now, allow_at - now}
      else
        states[j] = {math.floor((now + WINDOW - new) / interval + EPS), new - now, 0}
        writes[#writes + 1] = {key, new}
      end
    end
  end
  if admitted == 1 then
    for _, w in ipairs(writes) do
      if w[2] then store(w[1], w[2]) else hold(w[1], a.m) end
    end
  end
  out[i] = {admitted, states}
end
if #out == 0 then return '[]' end
return cjson.encode(out)
