-- Admission, settlement and lease refresh for the gateway's limits, in one atomic call.
-- The same GCRA arithmetic as gateway/ratelimit/memory.py, on the Redis server's clock.
--
-- KEYS: every bucket the call touches (all share one hash tag, so one slot on a Cluster).
-- ARGV[1]: one string of words separated by spaces (one argument is far cheaper for a client
-- to send than hundreds), in this order:
--   the call's marker: the key index of its marker, negative when the call is sent again, 0
--                   for a call without one (below),
--   K markers to drop: K, then their key indexes,
--   lease seconds,
--   R rule sets:    R, then per set: n, then n x (key index, kind, limit), a budget's with
--                   its counter's time to live in seconds after (0: kept for ever)
--   S settlements:  S, then per one: rule set, lease member, token delta
--   J adjustments:  J, then per one: key index, field ("-": the key is a counter, else a
--                   hash's field), amount, time to live in seconds (0: none set)
--   F refreshes:    F, then per one: key index, lease member
--   A admissions:   A, then per one: rule set, lease member, tokens, cost
-- A lease member is "-" for requests without parallel limits.
-- A call that carries money has a marker: the script stores its reply there (for MARK_S). A
-- call whose answer the client never had (a timeout) is sent again under the same marker,
-- with no admissions: if the first one ran, the stored reply comes back, prefixed "R", and
-- nothing is applied twice; the client then gives back what its admissions took. The client
-- drops a marker once it has the reply, with its next call.
-- kind: r requests, t tokens (a GCRA bucket: a string TAT), p parallel (a sorted set of lease
-- members scored by expiry), b budget (a counter of pico-dollars spent or reserved).
-- Amounts of money are whole pico-dollars, passed to INCRBY as the words they came in, so
-- counters are exact 64-bit integers. Lua's numbers are doubles, exact only to 2^53 (about
-- $9,007): budgets are compared and subtracted as pairs of base-10^9 digits instead, exact
-- to the pico-dollar over the whole 64-bit range.
-- Returns one string of numbers separated by spaces, per admission: admitted (0|1), then per
-- rule: remaining, reset ms, retry ms.
-- An admission writes only if every one of its rules admits it. Each bucket is read once and
-- written once per call, however many requests of the batch it serves.

local WINDOW = 60
local EPS = 1e-9  -- seconds: a cost that fills a bucket exactly to the window is admitted
local EPS_UNITS = 1e-6  -- units: a count rounding left a hair under a whole number is that number
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local words = {}
for w in string.gmatch(ARGV[1], '%S+') do words[#words + 1] = w end
local pos = 1
local function arg()
  local v = words[pos]
  pos = pos + 1
  return v
end
local MARK_S = 3600
local mark = tonumber(arg())
if mark < 0 then  -- sent again: only then can its reply be stored already
  mark = -mark
  local prior = redis.call('GET', KEYS[mark])
  if prior then return 'R ' .. prior end
end
for _ = 1, tonumber(arg()) do redis.call('DEL', KEYS[tonumber(arg())]) end
local lease = tonumber(arg())

-- Exact integers as {hi, lo}: hi * 10^9 + lo, 0 <= lo < 10^9 (hi carries the sign).
local BASE = 1000000000
local function big(s)
  local neg = string.sub(s, 1, 1) == '-'
  if neg then s = string.sub(s, 2) end
  local n, hi, lo = #s, 0, tonumber(s)
  if n > 9 then hi, lo = tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8)) end
  if not neg then return {hi, lo} end
  if lo == 0 then return {-hi, 0} end
  return {-hi - 1, BASE - lo}
end
local function plus(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= BASE then return {hi + 1, lo - BASE} end
  return {hi, lo}
end
local function minus(a, b)
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo < 0 then return {hi - 1, lo + BASE} end
  return {hi, lo}
end
local function below(a, b)  -- a < b
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end
local function text(a)
  if a[1] >= 0 then
    if a[1] == 0 then return string.format('%d', a[2]) end
    return string.format('%d%09d', a[1], a[2])
  end
  return '-' .. text(minus({0, 0}, a))
end

local sets = {}
for s = 1, tonumber(arg()) do
  local rules = {}
  for r = 1, tonumber(arg()) do
    local key, kind, word = KEYS[tonumber(arg())], arg(), arg()
    local rule = {key, kind, tonumber(word)}
    if kind == 'b' then rule[3] = big(word); rule[4] = tonumber(arg()) end
    rules[r] = rule
  end
  sets[s] = rules
end

-- A bucket is held here as how far it is drawn (its TAT less now, never below 0), in seconds:
-- arithmetic on epoch times would lose the low digits that tell a full bucket's last unit.
local aheads, dirty, used, removed, added, spent = {}, {}, {}, {}, {}, {}
local function ahead_of(key)
  local v = aheads[key]
  if v == nil then
    v = math.max((tonumber(redis.call('GET', key)) or now) - now, 0)
    aheads[key] = v
  end
  return v
end
local function used_of(key)
  local n = used[key]
  if n == nil then
    if removed[key] then redis.call('ZREM', key, unpack(removed[key])) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    n = redis.call('ZCARD', key)
    used[key] = n
  end
  return n
end

-- Settlements first: what they give back counts for the admissions of this same call.
for _ = 1, tonumber(arg()) do
  local rules, member, delta = sets[tonumber(arg())], arg(), tonumber(arg())
  for _, r in ipairs(rules) do
    local key, kind, limit = r[1], r[2], r[3]
    if kind == 'p' then
      removed[key] = removed[key] or {}
      table.insert(removed[key], member)
    elseif kind == 't' and delta ~= 0 then
      aheads[key] = math.max(0, ahead_of(key) + delta * WINDOW / limit)
      dirty[key] = true
    end
  end
end
for key, members in pairs(removed) do
  if used[key] == nil then used_of(key) end
end

-- Adjustments: budgets settled to what requests cost, and the spend ledger.
-- A counter's time to live is set when the counter is made (its value is then the amount
-- added), not at every addition.
for _ = 1, tonumber(arg()) do
  local key, field, amount, ttl = KEYS[tonumber(arg())], arg(), arg(), tonumber(arg())
  local now_at
  if field == '-' then
    now_at = redis.call('INCRBY', key, amount)
  else
    now_at = redis.call('HINCRBY', key, field, amount)
  end
  if ttl > 0 and now_at == tonumber(amount) then redis.call('EXPIRE', key, ttl) end
end
-- Budgets this call admits into: what they held (read once), and what the call adds (one
-- INCRBY each at the end, however many requests it admits).
local fresh, taken = {}, {}
local function spent_of(key)
  local v = spent[key]
  if v == nil then
    local held = redis.call('GET', key)
    if not held then fresh[key] = true end
    v = big(held or '0')
    spent[key] = v
  end
  return v
end

for _ = 1, tonumber(arg()) do
  local key, member = KEYS[tonumber(arg())], arg()
  redis.call('ZADD', key, 'XX', now + lease, member)
  redis.call('PEXPIRE', key, math.ceil(lease * 2000))
end

local out = {}
for _ = 1, tonumber(arg()) do
  local rules, member, tokens, cost = sets[tonumber(arg())], arg(), tonumber(arg()), arg()
  local price = big(cost)
  local admitted = 1
  local news = {}
  local first = #out + 2
  out[#out + 1] = '1'
  for i, r in ipairs(rules) do
    local key, kind, limit = r[1], r[2], r[3]
    local remaining, reset, retry
    if kind == 'b' then
      local have = minus(limit, spent_of(key))
      if below(have, price) then
        remaining, reset, retry = text(have), 0, 1
      else
        remaining, reset, retry = text(minus(have, price)), 0, 0
      end
    elseif kind == 'p' then
      local n = used_of(key)
      if n >= limit then
        remaining, reset, retry = 0, 0, 1
      else
        remaining, reset, retry = limit - n - 1, 0, 0
      end
    else
      local cost = 1
      if kind == 't' then cost = tokens end
      local interval = WINDOW / limit
      local ahead = ahead_of(key)
      local after = ahead + cost * interval
      if after > WINDOW + EPS then
        remaining, reset, retry = math.floor((WINDOW - ahead) / interval + EPS_UNITS), ahead, after - WINDOW
      else
        remaining, reset, retry = math.floor((WINDOW - after) / interval + EPS_UNITS), after, 0
        news[i] = after
      end
    end
    if retry > 0 then admitted = 0 end
    -- %d: whole numbers in full (tostring would write 1e+15); money is already text
    if kind == 'b' then
      out[#out + 1] = remaining .. string.format(' %d %d', math.ceil(reset * 1000), math.ceil(retry * 1000))
    else
      out[#out + 1] = string.format('%d %d %d', remaining, math.ceil(reset * 1000), math.ceil(retry * 1000))
    end
  end
  out[first - 1] = tostring(admitted)
  if admitted == 1 then
    for i, r in ipairs(rules) do
      local key = r[1]
      if r[2] == 'b' then
        spent[key] = plus(spent[key], price)
        taken[key] = {plus(taken[key] and taken[key][1] or {0, 0}, price), r[4]}
      elseif r[2] == 'p' then
        used[key] = used[key] + 1
        added[key] = added[key] or {}
        table.insert(added[key], now + lease)
        table.insert(added[key], member)
      else
        aheads[key] = news[i]
        dirty[key] = true
      end
    end
  end
end

for key, add in pairs(taken) do
  redis.call('INCRBY', key, text(add[1]))
  if fresh[key] and add[2] > 0 then redis.call('EXPIRE', key, add[2]) end
end
for key in pairs(dirty) do
  local ahead = aheads[key]
  redis.call('SET', key, string.format('%.6f', now + ahead), 'PX', math.ceil(ahead * 1000) + 1000)
end
for key, args in pairs(added) do
  redis.call('ZADD', key, unpack(args))
  redis.call('PEXPIRE', key, math.ceil(lease * 2000))
end
-- One string, not an array: a client parses one reply instead of ten numbers a request.
local reply = table.concat(out, ' ')
if mark > 0 then redis.call('SET', KEYS[mark], reply, 'EX', MARK_S) end
return reply
